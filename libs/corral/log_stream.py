"""Reading ranks' output from the bus: what `corral logs JOB` shows from any machine.

Why: `corral logs` must work from any machine, not only the host that ran a rank. Node agents
publish each rank's output to the stream `<NS>_LOGS` (`corral.contracts.logs`); this reads one job's
chunks (optionally one attempt, one rank) with a throwaway consumer: the history first, then, with
`follow`, new chunks as they come. Every chunk is checked (`decode_chunk`): one that is not valid,
or whose body disagrees with its subject, is skipped and reported through `on_refused`, never shown
as the job's output. Needs only the NATS address and a login that may read the job's subjects: its
owner's (the subjects naming them) or an admin's (every subject; see `corral.bus.auth`).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import nats.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from corral.bus import Bus
from corral.bus.naming import LOGS
from corral.contracts.envelope import Event
from corral.contracts.events import GangReserved
from corral.contracts.logs import LogChunk, LogChunkRefused, covered, decode_chunk, log_filter

_FETCH = 256
_IDLE = 1.0  # seconds one fetch waits for new chunks while following


@dataclass(frozen=True)
class LogQuery:
    """One job's output (optionally one attempt, one rank). `owner`: read only the subjects naming
    this user as the job's owner, what a person may read (their own name); None: every owner's and
    the version-1 subjects (an admin's reading)."""

    job_id: str
    attempt: int | None = None
    rank: int | None = None
    owner: str | None = None


class LogStreamUnavailable(Exception):
    """The stream cannot be read: missing (an older cluster) or this login may not read it."""


class RanksPlaced:
    """Which node ran each rank of each attempt of one job, as its GangReserved events say: a node
    agent may publish log chunks for its own node only (the bus enforces that), but for any job;
    a chunk whose node did not run that rank of that attempt is not the job's output.

    `read` returns the job's events of the log (the event store); it is read again when a chunk
    names an attempt not seen yet (a new attempt while following), at most once a second."""

    def __init__(self, read: Callable[[], Awaitable[Sequence[Event]]], clock: Callable[[], float]) -> None:
        self._read, self._clock = read, clock
        self._nodes: dict[int, dict[int, str]] = {}
        self._read_at = float("-inf")

    async def problem(self, chunk: LogChunk) -> str | None:
        """None when the chunk's node ran its rank in its attempt; else why it is skipped."""
        if chunk.attempt not in self._nodes and self._clock() - self._read_at >= 1.0:
            self._read_at = self._clock()
            for event in await self._read():
                if isinstance(event, GangReserved):
                    self._nodes[event.attempt] = {r.rank: r.node for r in event.ranks}
        ran = self._nodes.get(chunk.attempt, {}).get(chunk.rank)
        if ran == chunk.node:
            return None
        where = f"ran on {ran}" if ran else "has no placement in the log"
        return (f"skipped output that {chunk.node} published as attempt {chunk.attempt} rank {chunk.rank} of job "
                f"{chunk.job_id}: that rank {where}")


async def read_chunks(bus: Bus, query: LogQuery, on_chunk: Callable[[LogChunk], Awaitable[None] | None], *,
                      follow: bool = False, on_refused: Callable[[str], None] = lambda _: None,
                      timeout: float = 5.0, placed: RanksPlaced | None = None) -> int:
    """Call `on_chunk` for each chunk of `query` in the stream's order; return how many.

    Without `follow`, returns after the last chunk stored when it started; with it, waits for new
    chunks until cancelled. With `placed`, a chunk from a node that did not run its rank is
    skipped and reported through `on_refused`."""
    stream = bus.names.stream(LOGS)
    ns = bus.names.name
    if query.owner is not None:
        filters: dict[str, Any] = {"filter_subject": log_filter(ns, query.job_id, query.attempt, query.rank,
                                                                owner=query.owner)}
    else:
        filters = {"filter_subjects": [log_filter(ns, query.job_id, query.attempt, query.rank, any_owner=True),
                                       log_filter(ns, query.job_id, query.attempt, query.rank)]}
    # Named (unguessably): a login may create only consumers whose name and filter are tokens of
    # the API subject (`corral.bus.auth`); the nameless create carries its filter in the body only.
    config = ConsumerConfig(name=f"logs-{secrets.token_hex(8)}", **filters, deliver_policy=DeliverPolicy.ALL,
                            ack_policy=AckPolicy.NONE,
                            inactive_threshold=30.0, mem_storage=True, num_replicas=1)
    try:
        info = await asyncio.wait_for(bus.js.add_consumer(stream, config), timeout)
        sub = await bus.js.pull_subscribe_bind(info.name, stream=stream)
    except NotFoundError:
        raise LogStreamUnavailable(f"the cluster has no {stream} stream (its services predate log shipping)") from None
    except (TimeoutError, nats.errors.Error) as exc:
        needs = (f"the jobs of {query.owner} needs {query.owner}'s or an admin's login" if query.owner
                 else "every job needs an admin's login")
        raise LogStreamUnavailable(f"cannot read the {stream} stream ({type(exc).__name__}: {exc}); reading "
                                   f"the output of {needs}") from None
    pending = int(info.num_pending)
    seen = 0
    ends: dict[tuple[int, str, int], int] = {}  # how far each rank's file was seen
    try:
        while follow or pending > 0:
            try:
                messages = await sub.fetch(_FETCH, timeout=_IDLE if follow else timeout)
            except TimeoutError:
                if follow:
                    continue
                break
            for msg in messages:
                pending = int(msg.metadata.num_pending)
                try:
                    chunk = decode_chunk(bus.names.name, msg.subject, msg.data)
                except LogChunkRefused as exc:
                    on_refused(f"skipped a message on the log stream: {exc}")
                    continue
                if placed is not None and (problem := await placed.problem(chunk)) is not None:
                    on_refused(problem)
                    continue
                source = (chunk.attempt, chunk.node, chunk.rank)
                if covered(chunk, ends.get(source)):
                    continue  # sent again by a restarted agent
                ends[source] = max(chunk.end, ends.get(source, 0))
                seen += 1
                shown = on_chunk(chunk)
                if shown is not None:
                    await shown
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        with contextlib.suppress(Exception):
            await bus.js.delete_consumer(stream, info.name)
    return seen
