"""`corral logs JOB [--rank N] [--attempt K] [--follow]`: a job's output, from any machine.

Why: a rank's output must be readable from any machine, each attempt apart. The command reads the
chunks the node agents publish
(`corral.log_stream`), so it needs only the cluster's NATS address (a context file or `--nats`):
each attempt and rank apart, the history and then, with `--follow`, new lines as they come (as
`kubectl logs -f`). Where the bus has nothing of the job (or cannot be read) and the rank files
are on this machine (`<log_dir>/workers/<job>/rank-<N>.log`), those are shown instead. A person
reads their own jobs' output (the subjects naming them as the owner); another person's job is
refused, before anything is read; an admin reads every job's. The typer declaration and how it
prints; the reading is `corral.cli.commands.logs`'.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from typing import Annotated

import typer

from corral.cli.commands import CommandError
from corral.cli.commands import logs as commands
from corral.cli.output import console, err_console, print_json
from corral.cli.session import EXIT_FAILURE, EXIT_NO_CLUSTER, command_failed, context
from corral.contracts.logs import LogChunk
from corral.gateway.local import gateway_socket
from corral.job_logs import check_job_id
from corral.log_stream import LogQuery
from corral.stack.context import Context


def source_title(chunk: LogChunk) -> str:
    return f"attempt {chunk.attempt} · rank {chunk.rank} · {chunk.node}"


def chunk_text(chunk: LogChunk) -> str:
    """A chunk as printed: notes of what the agent left out, then its lines."""
    notes = []
    if chunk.skipped_bytes:
        notes.append(f"[corral: {chunk.skipped_bytes} bytes skipped: the rank wrote faster than its node ships; "
                     f"the whole file is on {chunk.node}]")
    if chunk.dropped:
        notes.append(f"[corral: {chunk.dropped} line(s) dropped by the rate limit; the whole file is on {chunk.node}]")
    return "".join(f"{line}\n" for line in [*notes, *chunk.lines])


class Printer:
    """Writes chunks as they come, with a title line whenever the source (attempt, rank) changes."""

    def __init__(self, write: Callable[[str], object], rule: Callable[[str], object]) -> None:
        self.write, self.rule = write, rule
        self.last: tuple[int, int, str] | None = None

    def __call__(self, chunk: LogChunk) -> None:
        source = (chunk.attempt, chunk.rank, chunk.node)
        if source != self.last:
            self.rule(source_title(chunk))
            self.last = source
        self.write(chunk_text(chunk))


def _note(message: str) -> None:
    err_console.print(f"[yellow]note:[/yellow] {message}", highlight=False)


def _following(json_out: bool) -> Callable[[LogChunk], None]:
    """How `--follow` prints each chunk as it comes: a JSON line, or under its source's title."""
    printer = Printer(lambda s: (sys.stdout.write(s), sys.stdout.flush()), lambda t: console.rule(t))

    def show(chunk: LogChunk) -> None:
        if json_out:
            sys.stdout.write(json.dumps({"attempt": chunk.attempt, "rank": chunk.rank, "node": chunk.node,
                                         "lines": chunk.lines, "dropped": chunk.dropped,
                                         "truncated": chunk.truncated, "skipped_bytes": chunk.skipped_bytes,
                                         "final": chunk.final}) + "\n")
            sys.stdout.flush()
        else:
            printer(chunk)

    return show


def _local(ctx: Context, query: LogQuery, json_out: bool) -> bool:
    """Print the job's rank files found on this machine, each attempt apart, in the form the bus's
    chunks are printed in (node unknown); False if there are none."""
    try:
        entries = commands.local_entries(ctx, query)
    except CommandError as exc:
        command_failed(exc)
    if not entries:
        return False
    err_console.print(f"[yellow]note:[/yellow] from the files under {commands.log_dir(ctx)} on this machine",
                      highlight=False)
    if json_out:
        print_json(entries)
        return True
    for e in entries:
        console.rule(f"attempt {'?' if e['attempt'] is None else e['attempt']} · rank {e['rank']} · {e['source']}")
        sys.stdout.write("".join(f"{line}\n" for line in e["lines"]))
    sys.stdout.flush()
    return True


def register(app: typer.Typer) -> None:
    @app.command()
    def logs(job: str,
             rank: Annotated[int | None, typer.Option(help="Only this rank.", min=0)] = None,
             attempt: Annotated[int | None, typer.Option(help="Only this attempt (0 is the first run).", min=0)] = None,
             follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines (Ctrl-C stops).")]
             = False,
             local: Annotated[bool, typer.Option("--local", help="Only the rank files on this machine "
                                                 "(the node that ran the rank keeps the whole file).")] = False,
             json_out: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False) -> None:
        """Worker output of a job, from any machine (the node agents publish it): all attempts and
        ranks, or one. Falls back to the rank files on this machine."""
        checked = check_job_id(job)
        if checked is not None:
            err_console.print(f"[red]error:[/red] {checked.message}", highlight=False)
            raise SystemExit(EXIT_FAILURE)
        ctx = context(need_postgres=False)
        query = LogQuery(job, attempt, rank)
        chunks: list[LogChunk] | None = None
        if not local and gateway_socket(ctx) is not None:
            # A person of this host with no login of their own: the gateway carries requests, not
            # output (reading it would need the bus's log stream).
            err_console.print("[yellow]note:[/yellow] through the local gateway (no credential of your own) the "
                              "bus's worker output cannot be read; looking for the job's files on this machine "
                              "(an admin can give you a login: corral user add)", highlight=False)
            local = True
        try:
            if not local:
                chunks = asyncio.run(commands.from_bus(ctx, query, _following(json_out) if follow else _ignore,
                                                       follow=follow, note=_note))
        except KeyboardInterrupt:
            return
        except commands.LogsForbidden as exc:
            err_console.print(f"[red]error:[/red] {exc}", highlight=False)
            raise SystemExit(EXIT_FAILURE) from None
        if follow and chunks is not None:
            return
        if chunks:
            if json_out:
                print_json(commands.group(chunks))
                return
            printer = Printer(lambda s: sys.stdout.write(s), lambda t: console.rule(t))
            for entry in sorted(chunks, key=lambda c: (c.attempt, c.rank, c.node, c.offset)):
                printer(entry)
            sys.stdout.flush()
            return
        if _local(ctx, query, json_out):
            return
        what = f"job {job!r}" + (f" attempt {attempt}" if attempt is not None else "") + \
            (f" rank {rank}" if rank is not None else "")
        where = "" if local else f"none on the bus of {ctx.nats_url}, and "
        err_console.print(f"[red]error:[/red] no logs for {what}: {where}no files under "
                          f"{ctx.log_dir or '.corral/logs'} here", highlight=False)
        raise SystemExit(EXIT_FAILURE if chunks is not None or local else EXIT_NO_CLUSTER)


def _ignore(chunk: LogChunk) -> None:
    """Without `--follow` the chunks are printed together once read."""
