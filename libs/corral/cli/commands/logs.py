"""`corral logs JOB`: a job's output, read from the chunks the node agents publish on the bus
(`corral.log_stream`), or from the rank files on this machine.

A person reads their own jobs' output: the bus's subjects name the owner, and its permissions let
a person's login read only their own; `from_bus` asks the log whose job it is first, so another
person's job is refused in words before anything is read (`LogsForbidden`), not by a silent
permission error. An admin reads every job's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from corral.bus.auth import Role
from corral.cli.commands import CommandError
from corral.contracts.envelope import Event, job_stream
from corral.contracts.events import JobSubmitted
from corral.contracts.logs import LogChunk
from corral.contracts.problems import ContractError
from corral.contracts.registry import decode
from corral.eventstore import EventStore
from corral.job_logs import LogsRefused, job_log_files, read_log, split_attempts
from corral.log_stream import LogQuery, LogStreamUnavailable, RanksPlaced, read_chunks
from corral.stack.context import Context
from corral.stack.credentials import NatsCredentials


class LogsForbidden(Exception):
    """This login may not read the job's output (another person's job)."""


async def from_bus(ctx: Context, query: LogQuery, on_chunk: Callable[[LogChunk], None], *, follow: bool,
                   note: Callable[[str], None]) -> list[LogChunk] | None:
    """The job's chunks, each also given to `on_chunk` as it comes (`follow`: until interrupted);
    None, with a `note` saying why, when the bus cannot be read. LogsForbidden for another
    person's job."""
    from corral.bus import Bus

    try:
        bus = await asyncio.wait_for(Bus.connect(ctx.nats_url, ctx.namespace, name="corral-logs",
                                                 credentials=ctx.credentials, ca=ctx.nats_ca), 5.0)
    except (TimeoutError, OSError) as exc:
        note(f"cannot reach NATS at {ctx.nats_url} ({type(exc).__name__}); looking for the job's files on this "
             "machine")
        return None
    chunks: list[LogChunk] = []

    def kept(chunk: LogChunk) -> None:
        chunks.append(chunk)
        on_chunk(chunk)

    store = await event_store(ctx, note)
    placed = None if store is None else RanksPlaced(lambda: job_events(store, query.job_id), time.monotonic)
    try:
        me = reader(ctx)
        if me is not None:  # a person: only their own jobs (the owner is a token of the subject)
            owner = await owner_of(store, query.job_id) if store is not None else None
            if owner is not None and owner != me:
                raise LogsForbidden(f"job {query.job_id} is {owner}'s: its output is readable by its owner and "
                                    f"the admins only (this login is {me}'s)")
            query = replace(query, owner=me)
        await read_chunks(bus, query, kept, follow=follow, on_refused=note, placed=placed)
    except LogStreamUnavailable as exc:
        note(f"{exc}; looking for the job's files on this machine")
        return None
    finally:
        await bus.close()
        if store is not None:
            await store.close()
    return chunks


def local_entries(ctx: Context, query: LogQuery) -> list[dict[str, Any]]:
    """The job's rank files on this machine, one entry per attempt and rank, in the form of the
    bus's (`group`; node unknown, `source` the file); CommandError for a path it may not read."""
    found = job_log_files(log_dir(ctx), query.job_id, query.rank)
    if isinstance(found, LogsRefused):
        raise CommandError(found.message)
    entries: list[dict[str, Any]] = []
    for f in found:
        rank = int(f.stem.removeprefix("rank-")) if f.stem.removeprefix("rank-").isdigit() else -1
        for attempt, lines in split_attempts(read_log(f), query.job_id).items():
            if query.attempt is None or attempt == query.attempt:
                entries.append({"attempt": attempt, "rank": rank, "node": None, "lines": lines, "truncated": 0,
                                "dropped": 0, "skipped_bytes": 0, "complete": None, "source": str(f)})
    entries.sort(key=lambda e: (-1 if e["attempt"] is None else e["attempt"], e["rank"]))
    return entries


def log_dir(ctx: Context) -> Path:
    return Path(ctx.log_dir or ".corral/logs")


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


def reader(ctx: Context) -> str | None:
    """The person this login reads as, or None for an admin (or a cluster without logins), who
    reads every job's output."""
    if not ctx.credentials:
        return None
    try:
        creds = NatsCredentials.load(ctx.credentials)
    except (OSError, ValueError, KeyError):
        return None  # unreadable: connecting said so already
    return None if creds.role in ("", Role.ADMIN.value, Role.SUPERUSER.value) else creds.user


async def owner_of(store: EventStore, job_id: str) -> str | None:
    """The user the job's JobSubmitted records; None if the log has no such job (yet)."""
    for event in await job_events(store, job_id):
        if isinstance(event, JobSubmitted):
            return event.user
    return None


async def event_store(ctx: Context, note: Callable[[str], None]) -> EventStore | None:
    """The log, to check which node ran each rank (a node could publish output for any job);
    None, said, where it cannot be read: the chunks are then shown unchecked."""
    if not ctx.postgres_dsn:
        return None
    try:
        return await asyncio.wait_for(EventStore.open(ctx.postgres_dsn, pool_size=2, min_size=1), 5.0)
    except Exception as exc:  # any failure to reach it: the output is still worth showing
        note(f"cannot read the event log ({type(exc).__name__}); each chunk's node is not checked")
        return None


async def job_events(store: EventStore, job_id: str) -> list[Event]:
    out: list[Event] = []
    for stored in await store.read_stream(job_stream(job_id)):
        with contextlib.suppress(ContractError):
            out.append(decode(stored.data))
    return out
