"""What a node agent tells the rest of Corral: its reports, built as events and published in order.

Why a queue in front of the bus: the supervisor reports from inside its process handling (a rank
starting, a rank exiting) and must never wait for NATS. Each report becomes an event once, and one
publisher task sends them in order to the inbox, retrying through an outage; JetStream drops a
retried duplicate by `Nats-Msg-Id` = event_id, so placement records each report once.

Why deterministic event ids: a restarted agent reports again what its stepds wrote down, since it
cannot know which reports the dead process published. The id of a report is a ULID made from the
time the stepd recorded (its milliseconds) and a hash of what is reported (node, kind, job, attempt,
rank, ...), so the second copy has the same `Nats-Msg-Id` and placement's tracking row (keyed by
it) drops it even outside JetStream's duplicate window.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import signal as signal_module
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import nats.errors

from corral.bus import Bus, Outgoing
from corral.bus.relay import CORRELATION_ID as CORRELATION
from corral.contracts.envelope import Event, Reason, job_stream, new_event_id
from corral.contracts.events import CheckpointDone, WorkerExited, WorkerStarted
from corral.contracts.registry import encode
from corral.contracts.subjects import Subjects

from ..process.supervisor import ExitReason, GangOutcome

log = logging.getLogger(__name__)

E = TypeVar("E", bound=Event)

_RETRY_PAUSE = 0.5
_BATCH = 256
START_FAILED = "START_FAILED"
"""WorkerExited reason code of a rank that never ran (could not be spawned, or the spec cannot run
here). `exit_code` is None. Ranks of this node not attempted after such a failure get GANG_KILLED."""


class ReportPublisher:
    """Publishes events to their inbox subjects, in the order they were sent, until they land."""

    def __init__(self, bus: Bus, subjects: Subjects) -> None:
        self._bus = bus
        self._subjects = subjects
        self._queue: asyncio.Queue[tuple[Event, asyncio.Future[None]]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="node-agent-reports")

    def send(self, event: Event) -> asyncio.Future[None]:
        """Queue `event` for the inbox; never blocks. The future is done once it is published."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((event, done))
        return done

    async def flush(self, timeout: float) -> bool:
        """Wait until everything queued so far is published (True) or `timeout` passes (False)."""
        try:
            await asyncio.wait_for(self._queue.join(), timeout)
            return True
        except TimeoutError:
            log.warning("node agent: %d report(s) not published at shutdown", self._queue.qsize())
            return False

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        # Everything queued meanwhile goes out together, pipelined and in order (one round trip
        # for the lot instead of one per report: 64 nodes report several times per job each).
        while True:
            items = [await self._queue.get()]
            while not self._queue.empty() and len(items) < _BATCH:
                items.append(self._queue.get_nowait())
            try:
                await self._publish([event for event, _ in items])
                for _, done in items:
                    if not done.done():
                        done.set_result(None)
            finally:
                for _ in items:
                    self._queue.task_done()

    async def _publish(self, events: list[Event]) -> None:
        messages = [Outgoing(report_subject(self._subjects, e), encode(e), e.event_id, {CORRELATION: e.correlation_id})
                    for e in events]
        while True:
            try:
                await self._bus.publish_many(messages)
                return
            except (nats.errors.Error, TimeoutError, OSError) as exc:
                # Republishing the lot is harmless: JetStream drops the ids it already has.
                log.warning("node agent: publishing %d report(s) from %s %s failed (%s); retrying", len(events),
                            events[0].type, events[0].event_id, exc)
                await asyncio.sleep(_RETRY_PAUSE)


def report_subject(subjects: Subjects, event: Event) -> str:
    """`<ns>.inbox.node.<node>.<Type>`: the node is the report's (or its actor's `node-agent/<node>`),
    the only subject this node's NATS identity may publish it on (see `corral.bus.auth`)."""
    node = getattr(event, "node", None) or event.actor.removeprefix("node-agent/")
    return subjects.node_report(node, event.type)


def exit_reason(code: str, exit_code: int | None, rank: int, message: str = "") -> Reason:
    """The Reason of a WorkerExited; a death by signal names the signal in `details`."""
    details: dict[str, object] = {}
    if exit_code is not None and exit_code < 0:
        try:
            details["signal"] = signal_module.Signals(-exit_code).name
        except ValueError:
            details["signal"] = str(-exit_code)
    how = message or (f"killed by {details['signal']}" if "signal" in details else f"exit code {exit_code}")
    return Reason(code=code, message=f"rank {rank}: {how}", details=details)


def report_id(at: float, *key: object) -> str:
    """The event id of a report: the same `at` and `key` give the same id (see the module doc)."""
    digest = hashlib.sha256("\x1f".join(str(k) for k in key).encode()).digest()
    return new_event_id(at, rand=digest[:10])


class NodeReports:
    """The supervisor's `AgentEvents` for one node: every callback becomes an inbox event.

    Job reports go to stream `job-<id>` with correlation id = job id, actor `node-agent/<node>`,
    the event that caused them (the GangReserved, a PreemptRequested, ...) as causation when known,
    `occurred_at` = the time the stepd recorded, and a deterministic id (see `report_id`).
    """

    def __init__(self, node: str, publisher: ReportPublisher) -> None:
        self.node = node
        self.actor = f"node-agent/{node}"
        self._publisher = publisher
        self._last: dict[str, asyncio.Future[None]] = {}  # per job: its newest report's publication

    def forget(self, job_id: str) -> None:
        self._last.pop(job_id, None)

    def unpublished_jobs(self) -> set[str]:
        """The jobs with a report not yet published: the node's heartbeats still list them, since
        a gang that ended here is not gone until its exit is on its way."""
        return {job_id for job_id, last in self._last.items() if not last.done()}

    def _send(self, cls: type[E], job_id: str, *, at: float, cause: str | None, key: tuple[object, ...],
              **payload: Any) -> None:
        event = cls.new(stream=job_stream(job_id), actor=self.actor, correlation_id=job_id, job_id=job_id,
                        now=datetime.fromtimestamp(at, UTC),
                        event_id=report_id(at, self.node, cls.__name__, job_id, *key), **payload)
        if cause:
            event = msgspec.structs.replace(event, causation_id=cause)
        self._last[job_id] = self._publisher.send(event)

    # --- AgentEvents ---------------------------------------------------------------------------

    async def worker_started(self, job_id: str, rank: int, pid: int, attempt: int, *, at: float,
                             cause: str | None) -> None:
        self._send(WorkerStarted, job_id, at=at, cause=cause, key=(attempt, rank), rank=rank, node=self.node,
                   pid=pid, attempt=attempt)

    async def worker_exited(self, job_id: str, rank: int, exit_code: int | None, attempt: int,
                            reason: ExitReason, *, at: float, cause: str | None, message: str = "") -> None:
        self._send(WorkerExited, job_id, at=at, cause=cause, key=(attempt, rank), rank=rank, node=self.node,
                   exit_code=exit_code if exit_code is not None and exit_code >= 0 else None,
                   attempt=attempt,
                   reason=exit_reason(reason.value.upper(), exit_code, rank, message))

    async def checkpoint_done(self, job_id: str, path: Path, step: int, rank: int, attempt: int, *, at: float,
                              cause: str | None) -> None:
        if rank != 0:
            return  # one copy of a data-parallel state: rank 0's checkpoint is the job's
        self._send(CheckpointDone, job_id, at=at, cause=cause, key=(attempt, rank, step, path), path=str(path),
                   step=step, rank=rank, attempt=attempt)

    async def gang_ended(self, outcome: GangOutcome) -> None:
        """Returns once every report of the gang is published (the supervisor then marks it reported)."""
        log.info("%s: job %s attempt %d ended here: %s %s", self.node, outcome.job_id,
                 outcome.attempt, outcome.end.value, dict(outcome.exits))
        last = self._last.get(outcome.job_id)
        if last is not None:
            await asyncio.shield(last)
            if self._last.get(outcome.job_id) is last:
                del self._last[outcome.job_id]

    # --- reports the supervisor does not make ---------------------------------------------------

    def rank_not_started(self, job_id: str, rank: int, attempt: int, code: str, message: str, *,
                         cause: Event | None = None) -> None:
        """A WorkerExited for a rank that never ran."""
        at = cause.occurred_at.timestamp() if cause is not None else datetime.now(UTC).timestamp()
        self._send(WorkerExited, job_id, at=at, cause=cause.event_id if cause else None,
                   key=(attempt, rank, "not-started"), rank=rank, node=self.node, exit_code=None,
                   attempt=attempt, reason=Reason(code=code, message=f"rank {rank}: {message}"))
