"""`corral nodes` and one frame of `corral top`, printed, without typer.

Why apart from their typer declarations (`corral.cli.cluster`, `corral.cli.observe`): on a large
cluster these are the reads a person runs most, and a fresh process's imports are most of what
they cost; `corral.cli.fast` calls these with plain arguments without loading typer, the typer
declarations call them with the rest. Their reading is `corral.cli.commands`': `corral nodes`
reads the nodes and only the jobs whose released GPUs are still held (`Client.nodes_view`), a
frame of top the active jobs too (its queues and pending jobs).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from corral.cli.output import console, print_json, print_table
from corral.cli.session import with_client


def nodes(all_nodes: bool, rack: str | None, state: str | None, json_out: bool) -> None:
    """The nodes of `rack` and in `state` (None: any); above `SUMMARY_ABOVE` of them with no filter
    and not `all_nodes`, one row per rack instead."""
    from corral.cli.commands import cluster as commands
    from corral.summary import SUMMARY_ABOVE

    picked = with_client(lambda c: commands.nodes(c, rack=rack, state=state), bus=False)
    if json_out:
        print_json(picked)
        return
    if len(picked) > SUMMARY_ABOVE and not (all_nodes or rack or state):
        _print_racks(picked)
        return
    print_table(None, ["NODE", "STATE", "RACK", "MODEL", "GPUS", "FREE", "RELEASING",
                       "GPU MAP (job per GPU, ~: releasing, |: NVLink)"],
                [(r["node"], r["state"], r["rack"], r["model"], r["gpus"], r["free"], len(r["releasing"]),
                  r["map"]) for r in picked])
    for r in picked:
        for c in r["conditions"]:
            console.print(f"{r['node']}: {c['type']}: {c['message']}; no new work until it clears",
                          highlight=False, soft_wrap=True)
        for g, p in r["unhealthy"].items():
            console.print(f"{r['node']}:{g} unhealthy (X): {p['code']}: {p['message']}; no new work on it",
                          highlight=False, soft_wrap=True)
        for g, d in r["drained_gpus"].items():
            why = f": {d['message']}" if d["message"] else ""
            console.print(f"{r['node']}:{g} drained (D) by {d['user']}{why}; corral gpu undrain {r['node']}:{g}",
                          highlight=False, soft_wrap=True)


def _print_racks(rows: list[dict[str, Any]]) -> None:
    """A large cluster at a glance: one row per rack, the totals, and how to see nodes."""
    from corral.summary import rack_rows

    racks = rack_rows(rows)
    print_table(None, ["RACK", "NODES", "READY", "DRAINING", "PRESSURE", "LOST", "GPUS", "IN USE", "FREE",
                       "RELEASING", "MODEL"],
                [(r["rack"], r["nodes"], r["ready"], r["draining"], r["pressure"], r["lost"], r["gpus"], r["used"],
                  r["free"], r["releasing"], ",".join(r["models"])) for r in racks])
    total = {k: sum(r[k] for r in racks) for k in ("nodes", "ready", "lost", "gpus", "used", "free")}
    console.print(f"{total['nodes']} nodes in {len(racks)} racks ({total['ready']} ready, {total['lost']} lost); "
                  f"GPUs {total['used']}/{total['gpus']} in use, {total['free']} free. Each node: "
                  "corral nodes --rack RACK, --state STATE or --all", highlight=False, soft_wrap=True)


def top_once(json_out: bool) -> None:
    """One frame of `corral top`, drawn (`--once`) or as JSON."""
    from corral.cli.commands import observe as commands
    from corral.cli.top_screen import render, snapshot

    data = snapshot(with_client(commands.top_view, bus=False), datetime.now(UTC))
    if json_out:
        print_json(data)
    else:
        console.print(render(data, console.width))
