"""`corral logs JOB [--rank N] [--attempt K] [--follow]`: a job's output, from any machine.

Why: a rank's output must be readable from any machine, each attempt apart. The command reads the
chunks the node agents publish
(`corral.log_stream`), so it needs only the cluster's NATS address (a context file or `--nats`):
each attempt and rank apart, the history and then, with `--follow`, new lines as they come (as
`kubectl logs -f`). Where the bus has nothing of the job (or cannot be read) and the rank files
are on this machine (`<log_dir>/workers/<job>/rank-<N>.log`), those are shown instead. A person
reads their own jobs' output (the subjects naming them as the owner); another person's job is
refused, before anything is read; an admin reads every job's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from corral.bus import Bus
from corral.bus.auth import Role
from corral.cli.output import console, err_console, print_json
from corral.cli.session import EXIT_FAILURE, EXIT_NO_CLUSTER, context
from corral.contracts.envelope import Event, job_stream
from corral.contracts.events import JobSubmitted
from corral.contracts.logs import LogChunk
from corral.contracts.problems import ContractError
from corral.contracts.registry import decode
from corral.eventstore import EventStore
from corral.gateway.local import gateway_socket
from corral.job_logs import LogsRefused, check_job_id, job_log_files, read_log, split_attempts
from corral.log_stream import LogQuery, LogStreamUnavailable, RanksPlaced, read_chunks
from corral.stack.context import Context
from corral.stack.credentials import NatsCredentials


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


def group(chunks: list[LogChunk]) -> list[dict[str, Any]]:
    """Chunks as one entry per (attempt, rank), in attempt, rank order: the `--json` form."""
    out: dict[tuple[int, int, str], dict[str, Any]] = {}
    for c in sorted(chunks, key=lambda c: (c.attempt, c.rank, c.node, c.offset)):
        entry = out.setdefault((c.attempt, c.rank, c.node), {
            "attempt": c.attempt, "rank": c.rank, "node": c.node, "lines": [], "truncated": 0, "dropped": 0,
            "skipped_bytes": 0, "complete": False, "source": "bus"})
        entry["lines"] += c.lines
        entry["truncated"] += c.truncated
        entry["dropped"] += c.dropped
        entry["skipped_bytes"] += c.skipped_bytes
        entry["complete"] = entry["complete"] or c.final
    return list(out.values())


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


async def _from_bus(ctx: Context, query: LogQuery, follow: bool, json_out: bool) -> list[LogChunk] | None:
    """The job's chunks (printed as they come when following); None if the bus cannot be read."""
    try:
        bus = await asyncio.wait_for(Bus.connect(ctx.nats_url, ctx.namespace, name="corral-logs",
                                                 credentials=ctx.credentials, ca=ctx.nats_ca), 5.0)
    except (TimeoutError, OSError) as exc:
        err_console.print(f"[yellow]note:[/yellow] cannot reach NATS at {ctx.nats_url} ({type(exc).__name__}); "
                          "looking for the job's files on this machine", highlight=False)
        return None

    def refused(message: str) -> None:
        err_console.print(f"[yellow]note:[/yellow] {message}", highlight=False)

    chunks: list[LogChunk] = []
    printer = Printer(lambda s: (sys.stdout.write(s), sys.stdout.flush()), lambda t: console.rule(t))

    def on_chunk(chunk: LogChunk) -> None:
        chunks.append(chunk)
        if follow and json_out:
            sys.stdout.write(json.dumps({"attempt": chunk.attempt, "rank": chunk.rank, "node": chunk.node,
                                         "lines": chunk.lines, "dropped": chunk.dropped,
                                         "truncated": chunk.truncated, "skipped_bytes": chunk.skipped_bytes,
                                         "final": chunk.final}) + "\n")
            sys.stdout.flush()
        elif follow:
            printer(chunk)

    store = await _event_store(ctx, refused)
    placed = None if store is None else RanksPlaced(lambda: _job_events(store, query.job_id), time.monotonic)
    try:
        reader = _reader(ctx)
        if reader is not None:  # a person: only their own jobs (the owner is a token of the subject)
            owner = await _owner(store, query.job_id) if store is not None else None
            if owner is not None and owner != reader:
                raise LogsForbidden(f"job {query.job_id} is {owner}'s: its output is readable by its owner and "
                                    f"the admins only (this login is {reader}'s)")
            query = replace(query, owner=reader)
        await read_chunks(bus, query, on_chunk, follow=follow, on_refused=refused, placed=placed)
    except LogStreamUnavailable as exc:
        refused(f"{exc}; looking for the job's files on this machine")
        return None
    finally:
        await bus.close()
        if store is not None:
            await store.close()
    return chunks


class LogsForbidden(Exception):
    """This login may not read the job's output (another person's job)."""


def _reader(ctx: Context) -> str | None:
    """The person this login reads as, or None for an admin (or a cluster without logins), who
    reads every job's output."""
    if not ctx.credentials:
        return None
    try:
        creds = NatsCredentials.load(ctx.credentials)
    except (OSError, ValueError, KeyError):
        return None  # unreadable: connecting said so already
    return None if creds.role in ("", Role.ADMIN.value, Role.SUPERUSER.value) else creds.user


async def _owner(store: EventStore, job_id: str) -> str | None:
    """The user the job's JobSubmitted records; None if the log has no such job (yet)."""
    for event in await _job_events(store, job_id):
        if isinstance(event, JobSubmitted):
            return event.user
    return None


async def _event_store(ctx: Context, note: Callable[[str], None]) -> EventStore | None:
    """The log, to check which node ran each rank (a node could publish output for any job);
    None, said, where it cannot be read: the chunks are then shown unchecked."""
    if not ctx.postgres_dsn:
        return None
    try:
        return await asyncio.wait_for(EventStore.open(ctx.postgres_dsn, pool_size=2, min_size=1), 5.0)
    except Exception as exc:  # any failure to reach it: the output is still worth showing
        note(f"cannot read the event log ({type(exc).__name__}); each chunk's node is not checked")
        return None


async def _job_events(store: EventStore, job_id: str) -> list[Event]:
    out: list[Event] = []
    for stored in await store.read_stream(job_stream(job_id)):
        with contextlib.suppress(ContractError):
            out.append(decode(stored.data))
    return out


def _local(ctx: Context, query: LogQuery, json_out: bool) -> bool:
    """Print the job's rank files found on this machine, each attempt apart, in the form the bus's
    chunks are printed in (node unknown); False if there are none."""
    log_dir = Path(ctx.log_dir or ".corral/logs")
    found = job_log_files(log_dir, query.job_id, query.rank)
    if isinstance(found, LogsRefused):
        err_console.print(f"[red]error:[/red] {found.message}", highlight=False)
        raise SystemExit(EXIT_FAILURE)
    entries: list[dict[str, Any]] = []
    for f in found:
        rank = int(f.stem.removeprefix("rank-")) if f.stem.removeprefix("rank-").isdigit() else -1
        for attempt, lines in split_attempts(read_log(f), query.job_id).items():
            if query.attempt is None or attempt == query.attempt:
                entries.append({"attempt": attempt, "rank": rank, "node": None, "lines": lines, "truncated": 0,
                                "dropped": 0, "skipped_bytes": 0, "complete": None, "source": str(f)})
    if not entries:
        return False
    entries.sort(key=lambda e: (-1 if e["attempt"] is None else e["attempt"], e["rank"]))
    err_console.print(f"[yellow]note:[/yellow] from the files under {log_dir} on this machine", highlight=False)
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
                chunks = asyncio.run(_from_bus(ctx, query, follow, json_out))
        except KeyboardInterrupt:
            return
        except LogsForbidden as exc:
            err_console.print(f"[red]error:[/red] {exc}", highlight=False)
            raise SystemExit(EXIT_FAILURE) from None
        if follow and chunks is not None:
            return
        if chunks:
            if json_out:
                print_json(group(chunks))
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
