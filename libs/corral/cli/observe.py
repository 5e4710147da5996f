"""`corral usage` (sreport/sacct: who used what) and `corral top` (the cluster, live).

Both read the log only: usage folds it with `corral.accounting`; top reads the cluster now for
each frame from the read model (like `corral nodes` and `corral queues`) and draws one screen
(`corral.cli.top_screen`).
The typer declarations; the reading is `corral.cli.commands.observe`'s.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Annotated

import typer

from corral.accounting import GroupBy, Window
from corral.bus import is_unavailable
from corral.cli import nodes_top
from corral.cli.cluster import JsonOpt, parse_time
from corral.cli.commands import observe as commands
from corral.cli.output import console, print_json, print_table
from corral.cli.session import with_client
from corral.cli.top_screen import render, snapshot
from corral.client import Client


def _hours(value: float) -> str:
    return f"{value:,.2f}"


def register(app: typer.Typer) -> None:
    @app.command()
    def usage(
        since: Annotated[str | None, typer.Option(help="From: ISO 8601 or -7d (default: the log's start).")] = None,
        until: Annotated[str | None, typer.Option(help="Up to this time: ISO 8601, -1h or now (default).")] = None,
        by: Annotated[GroupBy, typer.Option("--by", help="One row per queue, user or job.")] = GroupBy.QUEUE,
        json_out: JsonOpt = False,
    ) -> None:
        """GPU-hours used, waited, and lost to preemption and to failures, per queue, user or job,
        from the event log (like Slurm's sreport / sacct). Used: GPUs held from placement until their
        processes were gone; waited: the job's GPUs times its wait for a place; lost: GPU-time since
        the attempt's last checkpoint (or start) thrown away by a preemption or a failure."""
        window = Window(until=parse_time(until) if until else datetime.now(UTC),
                        since=parse_time(since) if since else None)
        rows, overall = with_client(lambda c: commands.usage(c, window, by), bus=False)
        if json_out:
            print_json({"since": window.since.isoformat() if window.since else None, "until": window.until.isoformat(),
                        "by": by.value, "rows": [r.as_dict(by) for r in rows], "total": overall.as_dict(by)})
            return
        print_table(f"GPU-hours {window.since.isoformat(timespec='seconds') if window.since else 'since the start'}"
                    f" until {window.until.isoformat(timespec='seconds')}",
                    [by.value.upper(), "JOBS", "USED", "WAITED", "LOST (PREEMPTION)", "LOST (FAILURES)"],
                    [(r.key, r.jobs, _hours(r.used), _hours(r.waited), _hours(r.lost_preemption),
                      _hours(r.lost_failure)) for r in [*rows, overall]])

    @app.command()
    def top(
        once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
        interval: Annotated[float, typer.Option(help="Seconds between refreshes.", min=0.2)] = 2.0,
        json_out: JsonOpt = False,
    ) -> None:
        """A live view of the cluster (like top): the nodes' GPU map, the queues' use against their
        guarantee and fair share, the pending jobs with their reasons. Ctrl-C quits."""
        if once or json_out:
            nodes_top.top_once(json_out)
            return

        async def live(c: Client) -> None:
            from rich.live import Live

            data = snapshot(await commands.top_view(c), datetime.now(UTC))
            with Live(render(data, console.width), console=console.rich, screen=True, auto_refresh=False) as screen:
                while True:
                    started = time.monotonic()
                    note = None
                    try:
                        data = snapshot(await commands.top_view(c), datetime.now(UTC))
                    except Exception as exc:  # the log unreachable for a moment: keep the last frame
                        if not is_unavailable(exc):
                            raise
                        note = f"the log is unreachable ({type(exc).__name__}); showing {data['at']}, retrying"
                    screen.update(render(data, console.width, note=note), refresh=True)
                    await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

        try:
            with_client(live, bus=False)
        except KeyboardInterrupt:
            pass
