"""Which node agents an event of the log is work for, and the messages the relay sends them.

Why: an agent acts on a few events of the jobs placed on its node; on subjects naming no node
every agent would be sent every job's events (hosts x jobs deliveries: ~7,000 per job on 1,000
hosts). The relay, which reads the whole log in order anyway, sends each agent only its work on
`<ns>.events.node.<node>.<Kind>` (`corral.contracts.subjects.NODE_WORK_TYPES`), before the event's
own broadcast copy and with the event's own headers (stream, stream version, position: the checks
an agent makes), so deliveries per job grow with the nodes the job touches, not the cluster:

- GangReserved -> a `NodeAssignment` (the reservation, the job's JobSubmitted, the newest
  QueueConfigured of its queue) to each node of the gang;
- PreemptRequested (of the victim), GangReleased, JobCancelled, JobRequeued -> to every node a gang
  of the job was reserved on; not a GangReleased of a gang that completed (every rank reported
  its exit 0: nothing is left to stop, and it was one delivery per job for nothing);
- NodeLost -> to that node.

What the router keeps (the nodes of each job's gangs, the newest jobs' JobSubmitted, each queue's
newest QueueConfigured) is folded from the events it is shown, in the log's order; what it does
not hold (a relay that started mid-log, an entry forgotten for room: bounded, as every process's
memory) is read from the store, the job's or queue's stream up to the event's position. A job's
entry goes when it completes or fails.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

import msgspec

from corral.bus.bus import Outgoing
from corral.contracts import events as ev
from corral.contracts.envelope import job_stream, queue_stream
from corral.contracts.flow import names
from corral.contracts.lifecycle import LifecycleCode
from corral.contracts.node_work import JOB_WORK as JOB_WORK_EVENTS
from corral.contracts.node_work import KIND, encode_assignment
from corral.contracts.subjects import Subjects
from corral.eventstore import EventStore, StoredEvent

log = logging.getLogger(__name__)
S = TypeVar("S", bound=msgspec.Struct)

#: Log events sent to the nodes of the job they name.
JOB_WORK = names(JOB_WORK_EVENTS)
_ENDED = names((ev.JobCompleted, ev.JobFailed, ev.JobRejected))
_SUBMITTED, _QUEUE, _GANG = ev.JobSubmitted.type_name(), ev.QueueConfigured.type_name(), ev.GangReserved.type_name()
_LOST, _PREEMPT = ev.NodeLost.type_name(), ev.PreemptRequested.type_name()
_RELEASED = ev.GangReleased.type_name()
#: The release of a gang whose every rank exited 0 (`corral.lifecycle`): nothing of it runs.
_COMPLETED = LifecycleCode.COMPLETED.value
_JOBS_KEPT = 50_000  # jobs whose gangs' nodes are kept (a few names each)
_SPECS_KEPT = 2_000  # submissions whose bytes are kept (20 s of 100 jobs/s)
_QUEUES_KEPT = 10_000


class _Node(msgspec.Struct):
    node: str


class _Gang(msgspec.Struct):
    job_id: str
    ranks: list[_Node]


class _Victim(msgspec.Struct):
    victim_job_id: str


class _Code(msgspec.Struct):
    code: str = ""


class _Release(msgspec.Struct):
    reason: _Code


class _Spec(msgspec.Struct):
    queue: str = ""


class _Submission(msgspec.Struct):
    spec: _Spec


class _QueueName(msgspec.Struct):
    name: str


class _Queue(msgspec.Struct):
    queue: _QueueName


class _Job:
    __slots__ = ("nodes", "queue")

    def __init__(self) -> None:
        self.nodes: set[str] = set()
        self.queue: str | None = None


class NodeWorkRouter:
    """Folds the log as the relay publishes it; `work(event)` is the node messages for `event`."""

    def __init__(self, store: EventStore, subjects: Subjects, headers: Callable[[StoredEvent], dict[str, str]],
                 *, jobs_kept: int = _JOBS_KEPT) -> None:
        self.store = store
        self.subjects = subjects
        self._headers = headers
        self._jobs: OrderedDict[str, _Job] = OrderedDict()
        #: the newest submissions' bytes (most are placed within seconds; older ones are read again)
        self._specs: OrderedDict[str, bytes] = OrderedDict()
        self._queues: OrderedDict[str, StoredEvent] = OrderedDict()
        self._jobs_kept = jobs_kept
        #: messages sent so far per kind (what a benchmark or a test counts)
        self.sent: dict[str, int] = {}

    async def work(self, event: StoredEvent, max_bytes: int | None = None) -> list[Outgoing]:
        """The messages for the node agents `event` is work for (none for most events). Folds
        `event` too: call it for every event, in the log's order."""
        kind = event.type
        if kind == _SUBMITTED:
            job = self._job(event.stream[4:])
            job.queue = _queue_of(event.data)
            self._keep_spec(event.stream[4:], event.data)
            return []
        if kind == _QUEUE:
            name = _decode(event.data, _Queue)
            if name is not None:
                self._queues[name.queue.name] = event
                self._queues.move_to_end(name.queue.name)
                while len(self._queues) > _QUEUES_KEPT:
                    self._queues.popitem(last=False)
            return []
        if kind == _LOST and event.stream.startswith("node-"):
            return [self._message(event, event.stream[5:], kind, event.data)]
        if kind == _GANG:
            gang = _decode(event.data, _Gang)
            if gang is None:
                return []
            job = await self._known(gang.job_id, event.position)
            nodes = sorted({r.node for r in gang.ranks})
            job.nodes.update(nodes)
            data = await self._assignment(event, gang.job_id, job, max_bytes)
            return [self._message(event, node, KIND, data) for node in nodes]
        if kind in JOB_WORK:
            if kind == _PREEMPT:
                victim = _decode(event.data, _Victim)
                job_id = victim.victim_job_id if victim is not None else ""
            else:
                job_id = event.stream[4:] if event.stream.startswith("job-") else ""
            if not job_id or (kind == _RELEASED and _completed(event.data)):
                return []
            job = await self._known(job_id, event.position)
            return [self._message(event, node, kind, event.data) for node in sorted(job.nodes)]
        if kind in _ENDED and event.stream.startswith("job-"):
            self._jobs.pop(event.stream[4:], None)
            self._specs.pop(event.stream[4:], None)
        return []

    def _message(self, event: StoredEvent, node: str, kind: str, data: bytes) -> Outgoing:
        self.sent[kind] = self.sent.get(kind, 0) + 1
        return Outgoing(self.subjects.node_work(node, kind), data, f"{event.event_id}@{node}", self._headers(event))

    def _keep_spec(self, job_id: str, data: bytes) -> None:
        self._specs[job_id] = data
        self._specs.move_to_end(job_id)
        while len(self._specs) > _SPECS_KEPT:
            self._specs.popitem(last=False)

    async def _assignment(self, event: StoredEvent, job_id: str, job: _Job, max_bytes: int | None) -> bytes:
        submission = self._specs.get(job_id)
        if submission is None:
            await self._read(job_id, job, event.position)
            submission = self._specs.get(job_id)
        queue = await self._queue(job.queue, event.position) if job.queue else None
        data = encode_assignment(event.data, submission, queue.data if queue is not None else None)
        if max_bytes is not None and len(data) > max_bytes - 1024:  # room for the headers
            log.error("%s: the assignment with its spec is %d bytes, over the bus's %d: sent without it (its "
                      "ranks are reported not started)", event.stream, len(data), max_bytes)
            data = encode_assignment(event.data, None, None)
        if submission is None:
            log.error("%s: no JobSubmitted in the log before its GangReserved (position %d)", event.stream,
                      event.position)
        return data

    def _job(self, job_id: str) -> _Job:
        job = self._jobs.get(job_id)
        if job is None:
            job = self._jobs[job_id] = _Job()
            while len(self._jobs) > self._jobs_kept:
                self._jobs.popitem(last=False)
        self._jobs.move_to_end(job_id)
        return job

    async def _known(self, job_id: str, position: int) -> _Job:
        """The job's entry; read from its stream (up to `position`) when not held."""
        if job_id in self._jobs:
            return self._job(job_id)
        job = self._job(job_id)
        await self._read(job_id, job, position)
        return job

    async def _read(self, job_id: str, job: _Job, position: int) -> None:
        """Fold the job's stream before `position` into `job` (and keep its submission's bytes)."""
        for stored in await self.store.read_stream(job_stream(job_id)):
            if stored.position >= position:
                break
            if stored.type == _SUBMITTED:
                job.queue = _queue_of(stored.data)
                self._keep_spec(job_id, stored.data)
            elif stored.type == _GANG:
                gang = _decode(stored.data, _Gang)
                if gang is not None:
                    job.nodes.update(r.node for r in gang.ranks)

    async def _queue(self, name: str, position: int) -> StoredEvent | None:
        held = self._queues.get(name)
        if held is not None:
            return held
        newest = None
        for stored in await self.store.read_stream(queue_stream(name)):
            if stored.position >= position:
                break
            if stored.type == _QUEUE:
                newest = stored
        if newest is not None:
            self._queues[name] = newest
        return newest


def _decode(data: bytes, cls: type[S]) -> S | None:
    try:
        return msgspec.json.decode(data, type=cls)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _queue_of(data: bytes) -> str | None:
    submission = _decode(data, _Submission)
    return (submission.spec.queue or None) if submission is not None else None


def _completed(data: bytes) -> bool:
    """Whether a GangReleased is of a gang that completed (undecodable: not known to be, so sent)."""
    release = _decode(data, _Release)
    return release is not None and release.reason.code == _COMPLETED
