"""A node's report about a gang whose reservation this service is still appending waits for that
append, and is then recorded.

Why: placement commits a GangReserved, the relay publishes it, the node agent starts the rank and
reports WorkerStarted; on a loaded machine all of that can happen before placement's own append
has returned and folded its batch. A report handled meanwhile meets a view where the job holds no
ranks, is refused ("its gang is on no node"), and the job never runs in the log's eyes (its
JobRunning waits for a start the log never recorded). No NATS or Postgres: the store stand-in
delivers the report from inside the append.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from corral.bus import Delivery
from corral.contracts import events as ev
from corral.contracts.cluster import GpuDevice
from corral.contracts.envelope import job_stream, node_stream
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.queues import QueueSpec
from corral.contracts.registry import encode
from corral.contracts.subjects import Subjects
from corral.services.placement.service import Placement
from tests.unit.services.doubles import Clock
from tests.unit.services.job_events import job_event
from tests.unit.services.test_own_append_overtaken import OvertakingStore

JOB = "j1"
NS = "ns"


class ReportingStore(OvertakingStore):
    """An event store whose append of a GangReserved, before it returns, lets the node's report of
    the gang's start be handled (`deliveries`)."""

    def meanwhile(self, plan: dict[str, tuple[int, list[Any]]]) -> list[asyncio.Task[None]]:
        assert self.service is not None
        if not any(e.type == "GangReserved" for _, events in plan.values() for e in events):
            return []
        started = job_event(JOB, ev.WorkerStarted, rank=0, node="n1", pid=1, attempt=0)
        delivery = Delivery(subject=Subjects(NS).node_report("n1", "WorkerStarted"), data=encode(started),
                            headers={}, delivery_count=1, stream="ns-inbox", stream_sequence=1,
                            consumer_sequence=1, timestamp=None)
        return [asyncio.create_task(self.service.on_inbox(delivery))]


async def test_a_start_reported_while_its_reservation_is_being_appended_is_recorded() -> None:
    clock = Clock(time.time())
    store = ReportingStore()
    bus: Any = SimpleNamespace(namespace=NS)
    placement = Placement(store, bus, clock=clock, monotonic=clock)  # type: ignore[arg-type]
    store.service = placement
    spec = validate_job_spec({"name": JOB, "queue": "q", "gpus_per_replica": 4, "runtime": "sim",
                              "duration_seconds": 60})
    node = ev.NodeRegistered.new(stream=node_stream("n1"), actor="agent", node="n1",
                                 gpus=[GpuDevice(index=i, model="H100") for i in range(8)],
                                 nvlink_domains=[list(range(8))], rack="r", zone="z")
    queue = ev.QueueConfigured.new(stream="queue-q", actor="test", queue=QueueSpec(name="q", guaranteed_gpus=8))
    job = [job_event(JOB, ev.JobSubmitted, spec=spec),
           job_event(JOB, ev.JobAdmitted, queue="q", priority=0, replicas=1, gpus_per_replica=4),
           job_event(JOB, ev.QuotaReserved, queue="q", gpus=4, borrowed=0)]
    for stream, events in ((node.stream, [node]), (queue.stream, [queue]), (job_stream(JOB), job)):
        for version, event in enumerate(events, 1):
            placement.view.apply(event, version)
            placement.folded(event)
        store.versions[stream] = len(events)
    placement.heartbeats["n1"] = clock.now

    await placement._cycle(clock.now)
    await asyncio.gather(*store.deliveries)
    assert [e.type for e in store.appended if e.stream == job_stream(JOB)] == ["GangReserved", "WorkerStarted"], \
        "the start was refused: the report met the view before the reservation was folded"
