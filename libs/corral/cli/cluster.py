"""Cluster commands: nodes, queues, apply, events, replay (sinfo / sacct / the audit log).

The typer declarations and how each prints; their work is `corral.cli.commands.cluster`'s and
`corral.cli.commands.queue_tree`'s."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer

from corral.cli import nodes_top
from corral.cli import queue_config as qc
from corral.cli.commands import CommandError, queue_tree
from corral.cli.commands import cluster as commands
from corral.cli.output import console, print_json, print_table
from corral.cli.present import JOB_COLUMNS
from corral.cli.session import command_failed, context, require_admin, with_client
from corral.cli.verdict_report import report
from corral.client import Client
from corral.contracts.queues import parse_gate

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


#: How long `corral apply` waits for quota to record the change (by default; it stays in quota's inbox after).
APPLY_WAIT = 30.0


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


def register(app: typer.Typer) -> None:
    @app.command()
    def nodes(all_nodes: Annotated[bool, typer.Option("--all", help="Every node, however many.")] = False,
              rack: Annotated[str | None, typer.Option(help="The nodes of this rack.")] = None,
              state: Annotated[str | None, typer.Option(help="The nodes in this state: ready, draining, pressure, "
                                                        "lost.")] = None,
              json_out: JsonOpt = False) -> None:
        """Nodes (like sinfo) with a per-GPU map: which job holds which GPU, NVLink domains split by |;
        RELEASING GPUs belong to a released gang whose processes are not confirmed gone yet. A node
        under `pressure` (disk or memory, measured by its agent) takes no new work: why is under the table,
        as for a GPU unhealthy (X: XID, ECC, fallen off the bus) or drained (D; `!` after a job on one).
        Above 64 nodes: one row per rack, unless --all, --rack or --state picks the nodes to show."""
        nodes_top.nodes(all_nodes, rack, state, json_out)

    @app.command()
    def queues(history: Annotated[bool, typer.Option("--history", help="The numbered versions of the tree: "
                                                      "who applied each, when and why.")] = False,
               diff: Annotated[tuple[int, int] | None, typer.Option(help="What changed between two versions, "
                                                                    "e.g. --diff 2 3.")] = None,
               json_out: JsonOpt = False) -> None:
        """The queue tree: guaranteed, max, GPUs in use (placed), quota reserved (pending jobs too),
        borrowed, lendable, pending jobs, share of the cluster in use."""
        if diff:
            first, second = diff
            changes = with_client(lambda c: queue_tree.diff(c, first, second), bus=False)
            print_json(changes) if json_out else qc.print_diff(first, second, changes)
            return
        if history:
            versions = with_client(queue_tree.history, bus=False)
            print_json(versions) if json_out else qc.print_history(versions)
            return
        rows = with_client(commands.queues, bus=False)
        if json_out:
            print_json(rows)
            return
        columns = ["QUEUE", "GUARANTEED", "MAX", "WEIGHT", "IN USE", "RESERVED", "BORROWED", "LENDABLE", "PENDING",
                   "SHARE"]
        print_table(None, columns,
                    [(r["queue"], r["guaranteed"], "-" if r["max"] is None else r["max"], r["weight"], r["in_use"],
                      r["reserved"], r["borrowed"], r["lendable"], r["pending"], f"{r['share']:.0%}") for r in rows])

    @app.command()
    def apply(file: Annotated[str | None, typer.Argument(
                  help="queues.yaml: {queues: [{name, guaranteed_gpus, ...}]}; with --rollback, the version to "
                       "restore (default: the one before the current)")] = None,
              message: Annotated[str, typer.Option("--message", "-m", help="Why: recorded with the version.")] = "",
              what_if: Annotated[bool, typer.Option("--what-if", help="Replay the recorded workload under the "
                                                    "current and the proposed tree and print both; apply nothing.")
                                 ] = False,
              since: Annotated[str, typer.Option(help="What-if: replay the jobs submitted since then (7d, 12h, "
                                                 "ISO 8601).")] = "7d",
              require: Annotated[list[str] | None, typer.Option(
                  "--require", help="Evidence gate: apply only if the what-if meets it, e.g. "
                                    "'queue team-a p95_wait <= 2h' (repeatable).")] = None,
              rollback: Annotated[bool, typer.Option("--rollback", help="Restore an earlier version of the tree "
                                                     "(as a new version).")] = False,
              wait: Annotated[bool, typer.Option(help="Wait until quota has recorded the new version.")] = True,
              timeout: Annotated[float, typer.Option(help="How long to wait for quota, in seconds.", min=0)
                                 ] = APPLY_WAIT,
              json_out: JsonOpt = False) -> None:
        """Create or change queues (the tree, quotas, weights, borrowing limits): each apply is a
        numbered version (corral queues --history); --what-if shows its effect first; quota refuses
        a change whose effect misses the queues file's standing gates or a --require; --rollback
        goes back."""
        try:
            for text in require or []:
                parse_gate(text)
        except ValueError as exc:
            command_failed(CommandError(str(exc)))
        if not what_if:
            require_admin("corral apply")
        start = parse_time(f"-{since}" if since[:1].isdigit() and since[-1:] in "smhd" else since)
        if what_if:  # a preview only: quota checks the gates of a change itself
            preview = with_client(lambda c: queue_tree.what_if(c, file, rollback=rollback, message=message,
                                                               require=require or [], since=start), bus=False)
            if json_out:
                print_json({"what_if": queue_tree.what_if_json(preview), "applied": False,
                            "refused": preview.refused})
            else:
                qc.print_what_if(preview.result, preview.checks)
            return
        applied = with_client(lambda c: queue_tree.apply_tree(c, file, rollback=rollback, message=message,
                                                              require=require or [], since=start, wait=wait,
                                                              timeout=timeout), lazy_bus=True)
        verdict, names = applied.verdict, applied.names
        if verdict is not None and verdict.refused and not json_out:
            qc.print_checks(applied.evidence)
        what = f"Rolled back to v{applied.rollback_of}" if applied.rollback_of else f"Applied {len(names)} queues"
        done = f"{what}: {', '.join(names)} (queue tree v{applied.version})"
        if verdict is None:  # --no-wait: the version it will be, unless another apply comes first
            if json_out:
                print_json(applied.fields())
            else:
                console.print(done, highlight=False)
            return
        report(verdict, "queue tree", fields=applied.fields(), waited=timeout, json_out=json_out, done=done,
               unchanged="quota recorded nothing")

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
        where = commands.EventFilter(job=job, types=[t.strip() for t in type_.split(",")] if type_ else None,
                                     start=parse_time(since) if since else None)

        async def go(c: Client) -> None:
            rows = await commands.events(c, where, limit)
            if json_out and not follow:
                print_json(rows)
                return
            _emit(rows, json_out)
            if not follow:
                return
            async for new in commands.follow(c, where, rows[-1]["position"] if rows else None):
                _emit(new, json_out, header=False)

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
        replayed = with_client(lambda c: commands.replay(c, moment), bus=False)
        state, rows, tree = replayed.state, replayed.jobs, replayed.tree
        if json_out:
            print_json({"until": moment.isoformat(), **state, "queue_tree": tree})
            return
        console.print(f"Cluster as of {moment.isoformat()} (log position {state['position']}, queue tree "
                      f"v{tree['version']}):", highlight=False)
        print_table("jobs (not finished)", JOB_COLUMNS, [[r[c.lower()] for c in JOB_COLUMNS] for r in rows],
                    below="REASON")
        print_table("nodes", ["NODE", "STATE", "ALLOCATED GPUS"],
                    [(n, s["state"], ", ".join(f"{g}:{j}" for g, j in s["allocations"].items()))
                     for n, s in state["nodes"].items()])


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
