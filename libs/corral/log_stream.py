"""Reading ranks' output from the bus: what `corral logs JOB` shows from any machine.

The problem: `corral logs` globbed the local disk, so it worked only on the host that ran a rank.
Node agents now publish each rank's output to the stream `<NS>_LOGS` (`corral.contracts.logs`);
this reads one job's chunks (optionally one attempt, one rank) with a throwaway consumer: the
history first, then, with `follow`, new chunks as they come. Every chunk is checked
(`decode_chunk`): one that is not valid, or whose body disagrees with its subject, is skipped and
reported through `on_refused`, never shown as the job's output. Needs only the NATS address and a
login that may read the stream (an admin's: see `corral.bus.auth`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

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
    job_id: str
    attempt: int | None = None
    rank: int | None = None


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
    subject = log_filter(bus.names.name, query.job_id, query.attempt, query.rank)
    config = ConsumerConfig(filter_subject=subject, deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE,
                            inactive_threshold=30.0, mem_storage=True, num_replicas=1)
    try:
        info = await asyncio.wait_for(bus.js.add_consumer(stream, config), timeout)
        sub = await bus.js.pull_subscribe_bind(info.name, stream=stream)
    except NotFoundError:
        raise LogStreamUnavailable(f"the cluster has no {stream} stream (its services predate log shipping)") from None
    except (TimeoutError, nats.errors.Error) as exc:
        raise LogStreamUnavailable(f"cannot read the {stream} stream ({type(exc).__name__}: {exc}); reading "
                                   "logs from the bus needs an admin's login (the context of `corral up`)") from None
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
