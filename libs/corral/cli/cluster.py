"""Cluster commands: nodes, queues, apply, events, replay (sinfo / sacct / the audit log)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer

from corral.cli.output import console, err_console, print_json, print_table
from corral.cli.present import JOB_COLUMNS, job_row, node_rows, queue_rows
from corral.cli.session import EXIT_FAILURE, context, with_client
from corral.client import Client
from corral.contracts.problems import SpecError
from corral.contracts.queues import load_queues_file
from corral.projection import ClusterView

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def parse_time(text: str) -> datetime:
    """'now', an ISO 8601 time, or a relative '-10m' / '-2h' / '-30s'."""
    if text == "now":
        return datetime.now(UTC)
    if text.startswith("-") and text[-1] in "smhd" and text[1:-1].isdigit():
        unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[text[-1]]
        return datetime.now(UTC) - timedelta(**{unit: int(text[1:-1])})
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a time: use now, -10m, or 2026-12-02T11:00:00Z") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def state_of(view: ClusterView) -> dict[str, Any]:
    """The cluster state a replay and the live services agree on (used by `replay` and its tests)."""
    return {
        "position": view.position,
        "jobs": {j.job_id: {"state": j.state.value, "attempt": j.attempt,
                            "ranks": [[r.rank, r.node, list(r.gpus)] for r in j.ranks] if j.holding else [],
                            "quota_gpus": j.quota_gpus, "reason": j.reason.code if j.reason else None}
                 for j in sorted(view.jobs.values(), key=lambda j: j.job_id)},
        "nodes": {n["node"]: {"state": n["state"], "allocations": n["allocations"]} for n in node_rows(view)},
        "queues": {q["queue"]: q["in_use"] for q in queue_rows(view)},
    }


def register(app: typer.Typer) -> None:
    @app.command()
    def nodes(json_out: JsonOpt = False) -> None:
        """Nodes (like sinfo) with a per-GPU map: which job holds which GPU, NVLink domains split by |;
        RELEASING GPUs belong to a released gang whose processes are not confirmed gone yet."""
        rows = with_client(lambda c: _view_rows(c, node_rows), bus=False)
        if json_out:
            print_json(rows)
            return
        print_table(None, ["NODE", "STATE", "RACK", "MODEL", "GPUS", "FREE", "RELEASING",
                           "GPU MAP (job per GPU, ~: releasing, |: NVLink)"],
                    [(r["node"], r["state"], r["rack"], r["model"], r["gpus"], r["free"], len(r["releasing"]),
                      r["map"]) for r in rows])

    @app.command()
    def queues(json_out: JsonOpt = False) -> None:
        """The queue tree: guaranteed, max, GPUs in use (placed), quota reserved (pending jobs too),
        borrowed, lendable, pending jobs, share of the cluster in use."""
        rows = with_client(lambda c: _view_rows(c, queue_rows), bus=False)
        if json_out:
            print_json(rows)
            return
        columns = ["QUEUE", "GUARANTEED", "MAX", "WEIGHT", "IN USE", "RESERVED", "BORROWED", "LENDABLE", "PENDING",
                   "SHARE"]
        print_table(None, columns,
                    [(r["queue"], r["guaranteed"], "-" if r["max"] is None else r["max"], r["weight"], r["in_use"],
                      r["reserved"], r["borrowed"], r["lendable"], r["pending"], f"{r['share']:.0%}") for r in rows])

    @app.command()
    def apply(file: Annotated[Path, typer.Argument(help="queues.yaml: {queues: [{name, guaranteed_gpus, ...}]}")],
              wait: Annotated[bool, typer.Option(help="Wait until quota has recorded every queue.")] = True,
              json_out: JsonOpt = False) -> None:
        """Create or change queues (the tree, quotas, weights, borrowing limits)."""
        try:
            spec = load_queues_file(file)
        except SpecError as exc:
            err_console.print(f"[red]error:[/red] {file} is not a valid queues file:", highlight=False)
            for p in exc.problems:
                err_console.print(f"  [bold]{p.path}[/bold]: {p.message}" + (f"\n    hint: {p.hint}" if p.hint else ""),
                                  highlight=False)
            raise SystemExit(EXIT_FAILURE) from None
        except OSError as exc:
            err_console.print(f"[red]error:[/red] cannot read {file}: {exc.strerror}", highlight=False)
            raise SystemExit(EXIT_FAILURE) from None

        async def go(c: Client) -> list[str]:
            names = await c.apply_queues(spec)
            if wait:
                wanted = {q.name: q for q in spec.resolved()}
                await c.wait_for(lambda v: all(v.queues.get(n) == q for n, q in wanted.items()), 30)
            return names

        names = with_client(go)
        if json_out:
            print_json({"applied": names})
        else:
            console.print(f"Applied {len(names)} queues: {', '.join(names)}", highlight=False)

    @app.command()
    def events(
        job: Annotated[str | None, typer.Option(help="Only events of this job.")] = None,
        type_: Annotated[str | None, typer.Option("--type", help="Only these types, comma-separated.")] = None,
        since: Annotated[str | None, typer.Option(help="From this time: ISO 8601 or -10m.")] = None,
        follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new events.")] = False,
        limit: Annotated[int, typer.Option(help="At most this many (newest), 0 = all.")] = 200,
        json_out: JsonOpt = False,
        export: Annotated[Path | None, typer.Option(
            "--export", help="Write the whole log with its hash chain to this file (verifies offline).")] = None,
    ) -> None:
        """The audit log from Postgres: every decision with its actor and reason."""
        if export is not None:
            from corral.eventstore.chain import export_bundle

            count = asyncio.run(export_bundle(context().postgres_dsn, export))
            if json_out:
                print_json({"exported": count, "file": str(export)})
            else:
                console.print(f"Exported {count} event(s) with their hash chain to {export}")
            return
        types = [t.strip() for t in type_.split(",")] if type_ else None
        start = parse_time(since) if since else None

        def keep(stored: Any, event: Any) -> bool:
            if job and stored.correlation_id != job and getattr(event, "job_id", None) != job \
                    and getattr(event, "victim_job_id", None) != job:
                return False
            return start is None or stored.occurred_at >= start

        def row(stored: Any, event: Any) -> dict[str, Any]:
            reason = getattr(event, "reason", None)
            return {"position": stored.position, "at": stored.occurred_at.isoformat(), "stream": stored.stream,
                    "type": stored.type, "actor": event.actor,
                    "job": getattr(event, "job_id", None) or getattr(event, "victim_job_id", None),
                    "reason": f"{reason.code}: {reason.message}" if reason is not None else ""}

        async def go(c: Client) -> None:
            rows = [row(s, e) for s, e in await c.events(types=types) if keep(s, e)]
            if limit:
                rows = rows[-limit:]
            if json_out and not follow:
                print_json(rows)
                return
            _emit(rows, json_out)
            if not follow:
                return
            after = rows[-1]["position"] if rows else (await c.store.head_position())
            while True:
                new = []
                for stored in await c.store.read_all(after, limit=1000):
                    after = stored.position
                    from corral.contracts.registry import decode

                    event = decode(stored.data)
                    if (types is None or stored.type in types) and keep(stored, event):
                        new.append(row(stored, event))
                if new:
                    _emit(new, json_out, header=False)
                await asyncio.sleep(0.5)

        try:
            with_client(go, bus=False)
        except KeyboardInterrupt:
            pass

    @app.command()
    def replay(
        until: Annotated[str, typer.Option(help="The moment to rebuild: now, -10m, or ISO 8601.")] = "now",
        json_out: JsonOpt = False,
    ) -> None:
        """The cluster's state at a past moment, rebuilt only from the Postgres event log."""
        moment = parse_time(until)

        async def go(c: Client) -> tuple[dict[str, Any], list[dict[str, Any]]]:
            view = await c.view(until=moment)
            rows = [job_row(j, moment) for j in sorted(view.jobs.values(), key=lambda j: j.job_id)
                    if not j.state.terminal]  # AGE as it was at that moment
            return state_of(view), rows

        state, rows = with_client(go, bus=False)
        if json_out:
            print_json({"until": moment.isoformat(), **state})
            return
        console.print(f"Cluster as of {moment.isoformat()} (log position {state['position']}):", highlight=False)
        print_table("jobs (not finished)", JOB_COLUMNS, [[r[c.lower()] for c in JOB_COLUMNS] for r in rows],
                    below="REASON")
        print_table("nodes", ["NODE", "STATE", "ALLOCATED GPUS"],
                    [(n, s["state"], ", ".join(f"{g}:{j}" for g, j in s["allocations"].items()))
                     for n, s in state["nodes"].items()])


async def _view_rows(c: Client, fn: Any) -> Any:
    return fn(await c.view())


def _emit(rows: list[dict[str, Any]], json_out: bool, header: bool = True) -> None:
    if json_out:
        for r in rows:
            print_json(r)
        return
    if header:
        print_table(None, ["POS", "AT", "TYPE", "BY", "JOB", "REASON"],
                    [(r["position"], r["at"][11:23], r["type"], r["actor"], r["job"] or "", r["reason"]) for r in rows])
    else:
        for r in rows:
            console.print(f"{r['position']:>6} {r['at'][11:23]} {r['type']:<18} {r['actor']:<20} {r['job'] or '':<16} "
                          f"{r['reason']}", highlight=False)
