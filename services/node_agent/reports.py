"""What a node agent tells the rest of Corral: its reports, built as events and published in order.

Why a queue in front of the bus: the supervisor reports from inside its process handling (a rank
starting, a rank exiting) and must never wait for NATS. Each report becomes an event once, with a
fixed `event_id`, and one publisher task sends them in order to the inbox, retrying through an
outage; JetStream drops a retried duplicate by `Nats-Msg-Id` = event_id, so placement records
each report once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal as signal_module
from pathlib import Path
from typing import Any, TypeVar

import nats.errors

from corral.bus import Bus, Outgoing
from corral.contracts.envelope import Event, Reason, job_stream
from corral.contracts.events import CheckpointDone, GangReserved, WorkerExited, WorkerStarted
from corral.contracts.registry import encode
from corral.contracts.subjects import Subjects

from .reservation import contract_attempt
from .supervisor import ExitReason, GangOutcome

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
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="node-agent-reports")

    def send(self, event: Event) -> None:
        """Queue `event` for the inbox; never blocks."""
        self._queue.put_nowait(event)

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
            events = [await self._queue.get()]
            while not self._queue.empty() and len(events) < _BATCH:
                events.append(self._queue.get_nowait())
            try:
                await self._publish(events)
            finally:
                for _ in events:
                    self._queue.task_done()

    async def _publish(self, events: list[Event]) -> None:
        messages = [Outgoing(report_subject(self._subjects, e), encode(e), e.event_id) for e in events]
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


class NodeReports:
    """The supervisor's `AgentEvents` for one node: every callback becomes an inbox event.

    Job reports go to stream `job-<id>` with correlation id = job id, actor `node-agent/<node>`,
    and the GangReserved (or PreemptRequested) that caused them as causation when known.
    """

    def __init__(self, node: str, publisher: ReportPublisher) -> None:
        self.node = node
        self.actor = f"node-agent/{node}"
        self._publisher = publisher
        self._causes: dict[str, Event] = {}

    def caused_by(self, job_id: str, event: GangReserved | Event) -> None:
        """Remember the event that the next reports of `job_id` answer."""
        self._causes[job_id] = event

    def forget(self, job_id: str) -> None:
        self._causes.pop(job_id, None)

    def _job_event(self, cls: type[E], job_id: str, **payload: Any) -> E:
        return cls.new(stream=job_stream(job_id), actor=self.actor, causation=self._causes.get(job_id),
                       correlation_id=job_id, job_id=job_id, **payload)

    # --- AgentEvents ---------------------------------------------------------------------------

    async def worker_started(self, job_id: str, rank: int, pid: int, attempt: int) -> None:
        self._publisher.send(self._job_event(WorkerStarted, job_id, rank=rank, node=self.node, pid=pid,
                                             attempt=contract_attempt(attempt)))

    async def worker_start_failed(self, job_id: str, rank: int, attempt: int, message: str) -> None:
        self.rank_not_started(job_id, rank, contract_attempt(attempt), START_FAILED, message)

    async def worker_exited(self, job_id: str, rank: int, exit_code: int, attempt: int,
                            reason: ExitReason) -> None:
        self._publisher.send(self._job_event(
            WorkerExited, job_id, rank=rank, node=self.node,
            exit_code=exit_code if exit_code >= 0 else None, attempt=contract_attempt(attempt),
            reason=exit_reason(reason.value.upper(), exit_code, rank)))

    async def checkpoint_done(self, job_id: str, path: Path, step: int, rank: int, attempt: int) -> None:
        if rank != 0:
            return  # one copy of a data-parallel state: rank 0's checkpoint is the job's
        self._publisher.send(self._job_event(CheckpointDone, job_id, path=str(path), step=step, rank=rank,
                                             attempt=contract_attempt(attempt)))

    async def gang_ended(self, outcome: GangOutcome) -> None:
        log.info("%s: job %s attempt %d ended here: %s %s", self.node, outcome.job_id,
                 contract_attempt(outcome.attempt), outcome.end.value, dict(outcome.exits))

    # --- reports the supervisor does not make ---------------------------------------------------

    def rank_not_started(self, job_id: str, rank: int, attempt: int, code: str, message: str) -> None:
        """A WorkerExited for a rank that never ran (attempt in contract numbering)."""
        self._publisher.send(self._job_event(
            WorkerExited, job_id, rank=rank, node=self.node, exit_code=None, attempt=attempt,
            reason=Reason(code=code, message=f"rank {rank}: {message}")))
