"""A service's own append, overtaken on the bus by the last event of its batch, is folded whole.

Why: placement appends a gang's end in one batch (JobRunning, GangReleased, JobRequeued) and folds
the batch when the append returns. JobRequeued is also written by preemption, so placement is sent
it over the bus; under load its copy can be delivered while the append is still returning. A fold
that takes the copy first (a reader that is not sent every type folds a version past the next)
and then skips the batch's earlier versions as folded already leaves the job requeued but still
holding a gang with no ranks: its lifecycle then marks attempt 1 running with no GangReserved
(every one of no ranks started), the attempt's GPUs are not fenced (the core places on them and the
allocations index refuses), and the job is both waiting and running (the core's snapshot refuses).
No NATS or Postgres: the store stand-in delivers the copy from inside the append.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from corral import core, lifecycle
from corral.bus import Delivery
from corral.contracts import events as ev
from corral.contracts.cluster import GpuDevice
from corral.contracts.envelope import Reason, job_stream, node_stream
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.queues import QueueSpec
from corral.contracts.registry import decode, encode
from corral.core.steps import placement_step
from corral.eventstore import StoredEvent
from corral.projection import JobState
from corral.services.base import to_new_event
from corral.services.placement.service import Placement
from tests.unit.services.doubles import Clock
from tests.unit.services.job_events import job_event

JOB = "j1"


def _delivery(event: Any, version: int) -> Delivery:
    return Delivery(subject=f"ns.events.{event.type}", data=encode(event),
                    headers={"Corral-Stream": event.stream, "Corral-Stream-Version": str(version)},
                    delivery_count=1, stream="ns-events", stream_sequence=version, consumer_sequence=version,
                    timestamp=None)


class OvertakingStore:
    """An event store whose append, before it returns, lets the bus deliver the copy of the last
    event appended to each job stream (what the service is sent of its own batch), from the bus's
    own task (`deliveries`)."""

    def __init__(self) -> None:
        self.service: Placement | None = None
        self.versions: dict[str, int] = {}
        self.appended: list[Any] = []
        self.deliveries: list[asyncio.Task[None]] = []
        self.initial: dict[str, list[Any]] = {}  # what the log held before the test's appends

    async def append_multi(self, plan: dict[str, tuple[int, list[Any]]], *, tracking: Any = None) -> dict[str, int]:
        assert self.service is not None
        out = {}
        for stream, (expected, events) in plan.items():
            assert self.versions.get(stream, 0) == expected, (stream, expected)
            self.versions[stream] = expected + len(events)
            self.appended.extend(events)
            out[stream] = self.versions[stream]
        self.deliveries.extend(self.meanwhile(plan))
        for _ in range(5):
            await asyncio.sleep(0)  # the bus's tasks run before the append returns
        return out

    def meanwhile(self, plan: dict[str, tuple[int, list[Any]]]) -> list[asyncio.Task[None]]:
        """What the bus delivers while the append is returning: the copy of each job stream's last event."""
        assert self.service is not None
        tasks = []
        for stream, (expected, events) in plan.items():
            last = events[-1]
            if stream.startswith("job-") and last.type in self.service.consumes:
                copy = _delivery(decode(last.data), expected + len(events))
                tasks.append(asyncio.create_task(self.service.on_event(copy)))
        return tasks


def _placement() -> tuple[Placement, OvertakingStore, Clock]:
    base = time.time()  # the events below are dated by the wall clock
    clock = Clock(base + 30.0)
    store = OvertakingStore()
    stand_in: Any = object()
    placement = Placement(store, stand_in, clock=clock, monotonic=clock)  # type: ignore[arg-type]
    store.service = placement
    spec = validate_job_spec({"name": JOB, "queue": "q", "gpus_per_replica": 4, "runtime": "sim",
                              "duration_seconds": 86400})
    node = ev.NodeRegistered.new(stream=node_stream("n1"), actor="agent", node="n1",
                                 gpus=[GpuDevice(index=i, model="H100") for i in range(8)],
                                 nvlink_domains=[list(range(8))], rack="r", zone="z")
    queue = ev.QueueConfigured.new(stream="queue-q", actor="test", queue=QueueSpec(name="q", guaranteed_gpus=8))
    reserved = job_event(JOB, ev.GangReserved, attempt=0, world_size=1, master_addr="127.0.0.1",
                         master_port=29500, ranks=[ev.RankPlacement(rank=0, node="n1", gpus=[0, 1, 2, 3])])
    allocated = ev.GpusAllocated.new(stream=node_stream("n1"), actor="placement", node="n1", job_id=JOB,
                                     gpus=[0, 1, 2, 3], attempt=0)
    started = job_event(JOB, ev.WorkerStarted, rank=0, node="n1", pid=1, attempt=0)
    job = [job_event(JOB, ev.JobSubmitted, spec=spec),
           job_event(JOB, ev.JobAdmitted, queue="q", priority=0, replicas=1, gpus_per_replica=4),
           job_event(JOB, ev.QuotaReserved, queue="q", gpus=4, borrowed=0), reserved, started]
    for stream, events in ((node.stream, [node, allocated]), (queue.stream, [queue]), (job_stream(JOB), job)):
        for version, event in enumerate(events, 1):
            placement.view.apply(event, version)
            placement.folded(event)
        store.versions[stream] = len(events)
        store.initial[stream] = [to_new_event(e) for e in events]
    # n1's heartbeats have not listed the job for longer than the bound (its workers are lost);
    # its start is read late, so the one pass marks it running and releases it; its agent lags
    # (has not handled the release), so attempt 0's GPUs stay fenced
    for at in (10.0, 20.0, 30.0):
        placement.beats.record("n1", base + at, [], 0)
    placement.limits = lifecycle.Limits(workers_lost=5.0)
    return placement, store, clock


async def test_a_batch_overtaken_by_its_own_requeue_is_folded_whole() -> None:
    placement, store, clock = _placement()
    await placement._lifecycles(clock.now)
    await asyncio.gather(*store.deliveries)
    assert [e.type for e in store.appended] == ["JobRunning", "GangReleased", "JobRequeued"]
    job = placement.view.jobs[JOB]
    # what the log says (a cold fold): attempt 1 waits, attempt 0's GPUs fenced until its rank is gone
    assert (job.state, job.attempt, job.holding, job.gang) == (JobState.PENDING, 1, False, None)
    assert list(job.fences) == [0] and job.fences[0].open == {"n1": (0, 1, 2, 3)}
    assert placement.view.versions[job_stream(JOB)] == 8

    # quota gives the job its GPUs back for attempt 1
    for version, event in ((9, job_event(JOB, ev.QuotaReleased, queue="q", gpus=4,
                                                  reason=Reason(code="QUOTA_RELEASED", message="given back"))),
                           (10, job_event(JOB, ev.QuotaReserved, queue="q", gpus=4, borrowed=0))):
        await placement.on_event(_delivery(event, version))
    store.appended.clear()
    clock.now += 1.0
    placement._lifecycles_full_at = float("-inf")
    steps = placement._steps(placement.view.jobs[JOB], clock.now)
    assert not [e for events in steps.values() for e in events if isinstance(e, ev.JobRunning)], \
        "attempt 1 marked running with no GangReserved"
    snapshot = placement.view.snapshot(clock.now, pending=list(placement._waiting.values()), releasing=True)
    for decision in placement_step(snapshot, placement.config):
        if isinstance(decision, core.Place):
            assert not set(decision.placement.gpus_by_node().get("n1", ())) & {0, 1, 2, 3}, \
                "placed on GPUs attempt 0 still holds"


class LogStore(OvertakingStore):
    """The stand-in with a log to fold again (`read_all`)."""

    def __init__(self, log: list[Any]) -> None:
        super().__init__()
        self.log = log

    async def read_all(self, after: int, limit: int) -> list[StoredEvent]:
        return [s for s in self.log if s.position > after][:limit]

    async def read_stream(self, stream: str, from_version: int = 1) -> list[StoredEvent]:
        return [s for s in self.log if s.stream == stream and s.version >= from_version]


async def test_a_view_both_waiting_and_holding_folds_the_log_again_instead_of_dying() -> None:
    """What the fold got wrong above, whatever the cause: a job waiting (quota reserved) and holding
    GPUs, which the core's snapshot refuses. Placement folds the log again (a cold fold, as the
    standby did) and goes on; the job is placed on free GPUs, not on those its last attempt holds."""
    placement, store, clock = _placement()
    await placement._lifecycles(clock.now)
    await asyncio.gather(*store.deliveries)
    quota = [job_event(JOB, ev.QuotaReleased, queue="q", gpus=4, reason=Reason(code="QUOTA_RELEASED", message="x")),
             job_event(JOB, ev.QuotaReserved, queue="q", gpus=4, borrowed=0)]
    for version, event in enumerate(quota, 9):
        await placement.on_event(_delivery(event, version))
    log: list[StoredEvent] = []
    for stream in (node_stream("n1"), "queue-q", job_stream(JOB)):  # nodes first, as they registered
        folded = store.initial.get(stream, []) + [e for e in store.appended if e.stream == stream]
        if stream == job_stream(JOB):
            folded += [to_new_event(e) for e in quota]
        for version, new in enumerate(folded, 1):
            log.append(StoredEvent(event_id=new.event_id, stream=stream, type=new.type,
                                   schema_version=new.schema_version, data=new.data, correlation_id=None,
                                   causation_id=None, occurred_at=new.occurred_at, version=version,
                                   position=len(log) + 1, recorded_at=new.occurred_at))
    cold = LogStore(log)
    cold.service, cold.versions = placement, {s: max(e.version for e in log if e.stream == s) for s in store.versions}
    placement.store = cold  # type: ignore[assignment]
    job = placement.view.jobs[JOB]
    job.holding, job.gang = True, lifecycle.GangState.STARTING  # the view broken as the overtaken fold left it
    placement.view._index(job)  # (the index is kept as events are folded)
    assert JOB in placement._waiting and placement.view.jobs[JOB].holding

    clock.now += 1.0
    await placement._cycle(clock.now)  # the view is folded again: no ValueError
    job = placement.view.jobs[JOB]
    assert (job.state, job.attempt, job.holding, list(job.fences)) == (JobState.PENDING, 1, False, [0])
    clock.now += 5.0
    await placement._cycle(clock.now)
    placed = placement.view.jobs[JOB]
    assert placed.holding and placed.attempt == 1, "placed on the fresh view"
    assert {g for r in placed.ranks for g in r.gpus} == {4, 5, 6, 7}

    # broken again right after the log was folded again: the log itself is taken for broken
    placed.state = JobState.PENDING
    placement.view._index(placed)
    clock.now += placement.tick_seconds + 1.0
    with pytest.raises(RuntimeError, match="again after folding the log again"):
        await placement._cycle(clock.now)


async def test_allocations_refused_by_the_database_fold_the_log_again() -> None:
    """The allocations index refusing a GPU held already says the view was wrong: the view that
    placed the job there (its last attempt's GPUs not fenced) is replaced by the log's."""
    import asyncpg

    placement, store, clock = _placement()
    await placement._lifecycles(clock.now)
    await asyncio.gather(*store.deliveries)
    job = placement.view.jobs[JOB]
    fence = job.fences.pop(0)  # the view broken: attempt 0's GPUs look free
    for g in fence.open["n1"]:
        del placement.view.nodes["n1"].allocations[g]
    placement.view._index(job)
    quota = job_event(JOB, ev.QuotaReserved, queue="q", gpus=4, borrowed=0)
    log: list[StoredEvent] = []
    for stream in (node_stream("n1"), "queue-q", job_stream(JOB)):
        folded = store.initial.get(stream, []) + [e for e in store.appended if e.stream == stream]
        for version, new in enumerate(folded, 1):
            log.append(StoredEvent(event_id=new.event_id, stream=stream, type=new.type,
                                   schema_version=new.schema_version, data=new.data, correlation_id=None,
                                   causation_id=None, occurred_at=new.occurred_at, version=version,
                                   position=len(log) + 1, recorded_at=new.occurred_at))
    await placement.on_event(_delivery(quota, 9))
    new = to_new_event(quota)
    log.append(StoredEvent(event_id=new.event_id, stream=new.stream, type=new.type, schema_version=1, data=new.data,
                           correlation_id=None, causation_id=None, occurred_at=new.occurred_at, version=9,
                           position=len(log) + 1, recorded_at=new.occurred_at))

    class Refusing(LogStore):
        async def append_multi(self, plan: Any, *, tracking: Any = None) -> dict[str, int]:
            if any(e.type == "GpusAllocated" and b'"gpus":[0' in e.data for _, (_, events) in plan.items()
                   for e in events):
                raise asyncpg.UniqueViolationError("Key (node, gpu)=(n1, 0) already exists.")
            return await super().append_multi(plan, tracking=tracking)

    refusing = Refusing(log)
    refusing.service = placement
    refusing.versions = {s: max(e.version for e in log if e.stream == s) for s in store.versions}
    placement.store = refusing  # type: ignore[assignment]
    clock.now += 1.0
    await placement._cycle(clock.now)  # placed on GPUs 0-3 by the broken view: refused
    assert not placement.view.jobs[JOB].holding
    fenced = placement.view.jobs[JOB].fences.get(0)
    assert fenced is not None and fenced.open == {"n1": (0, 1, 2, 3)}, "the log's view: attempt 0 fenced"
    clock.now += placement.tick_seconds + 1.0
    await placement._cycle(clock.now)
    placed = placement.view.jobs[JOB]
    assert placed.holding and {g for r in placed.ranks for g in r.gpus} == {4, 5, 6, 7}
