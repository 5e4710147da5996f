"""A cold fold (`Service.cold_fold`) starts only once the events and requests already being handled
are done, and holds back new ones until the log is folded again.

Why: handling an event or a request awaits (an append of this service to the same stream settling,
the store) and then reads and folds into `self.view`. A cold fold that replaced the view meanwhile
would have it fold into a view the log is still being read into: for a reader that is not sent
every type (it folds a version past the next, `ClusterView.apply`), an event folded there moves
its stream's version past the stream's earlier events, which the fold of the log then skips as
folded already: the job loses its submission. The store stand-in holds its append and its read
of the log until the test lets them go, so the interleaving is the same every run.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from corral.bus import Delivery
from corral.contracts import events as ev
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.registry import decode, encode
from corral.eventstore import NewEvent, StoredEvent
from corral.projection import ClusterView, JobState
from corral.services.base import Service, to_new_event
from tests.unit.services.doubles import Clock
from tests.unit.services.job_events import job_event


class HeldStore:
    """An event store in memory whose appends and reads of the whole log wait while held."""

    def __init__(self) -> None:
        self.log: list[StoredEvent] = []
        self.appends = asyncio.Event()
        self.reads = asyncio.Event()
        self.appends.set()
        self.reads.set()

    def version(self, stream: str) -> int:
        return sum(1 for s in self.log if s.stream == stream)

    def write(self, new: NewEvent) -> int:
        version = self.version(new.stream) + 1
        self.log.append(StoredEvent(event_id=new.event_id, stream=new.stream, type=new.type,
                                    schema_version=new.schema_version, data=new.data, correlation_id=None,
                                    causation_id=None, occurred_at=new.occurred_at, version=version,
                                    position=len(self.log) + 1, recorded_at=datetime.now(UTC)))
        return version

    async def append_multi(self, plan: dict[str, tuple[int, list[NewEvent]]], *,
                           tracking: Any = None) -> dict[str, int]:
        await self.appends.wait()
        out = {}
        for stream, (expected, events) in plan.items():
            assert self.version(stream) == expected
            for new in events:
                out[stream] = self.write(new)
        return out

    async def read_all(self, after: int, limit: int) -> list[StoredEvent]:
        await self.reads.wait()
        return [s for s in self.log if s.position > after][:limit]

    async def read_stream(self, stream: str, from_version: int = 1) -> list[StoredEvent]:
        return [s for s in self.log if s.stream == stream and s.version >= from_version]


class Recorder(Service):
    """A service sent some types only (its fold skips versions), recording the requests it gets."""

    name = "recorder"
    consumes = ("JobSubmitted", "JobAdmitted", "QuotaReserved")

    async def handle_inbox(self, event: Any, delivery: Delivery) -> None:
        assert await self.append({event.stream: [event]}, tracking=self.tracking(delivery))


def _delivery(subject: str, event: Any, version: int) -> Delivery:
    return Delivery(subject=subject, data=encode(event),
                    headers={"Corral-Stream": event.stream, "Corral-Stream-Version": str(version)},
                    delivery_count=1, stream="ns", stream_sequence=version, consumer_sequence=version, timestamp=None)


async def _turns() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_a_cold_fold_waits_for_what_is_being_folded_and_loses_nothing() -> None:
    store = HeldStore()
    spec = validate_job_spec({"name": "a", "queue": "q", "gpus_per_replica": 8, "runtime": "sim",
                              "duration_seconds": 60})
    for event in (job_event("a", ev.JobSubmitted, spec=spec),
                  job_event("a", ev.JobAdmitted, queue="q", priority=0, replicas=1, gpus_per_replica=8)):
        store.write(to_new_event(event))
    clock = Clock()
    service = Recorder(store, SimpleNamespace(namespace="ns"), clock=clock, monotonic=clock)
    await service.rebuild()

    # a request being handled: its append is on its way to the store
    store.appends.clear()
    reserved = job_event("a", ev.QuotaReserved, queue="q", gpus=8, borrowed=0)
    request = asyncio.create_task(service.on_inbox(_delivery("ns.inbox.QuotaReserved", reserved, 3)))
    await _turns()
    # the append's event comes back over the bus first: it waits for the append to settle
    copy = asyncio.create_task(service.on_event(_delivery("ns.events.QuotaReserved", reserved, 3)))
    await _turns()
    # the view is found broken: the log is folded again (its read held at first)
    store.reads.clear()
    refold = asyncio.create_task(service.cold_fold())
    await _turns()
    store.appends.set()
    await _turns()
    store.reads.set()
    await asyncio.gather(request, copy, refold)

    from_log = ClusterView()
    for stored in store.log:
        from_log.apply(decode(stored.data), stored.version, stored.position)
    job, expected = service.view.jobs["a"], from_log.jobs["a"]
    assert job.spec is not None, "the job's submission was skipped by the fold of the log"
    assert (job.state, job.queue, job.spec) == (expected.state, expected.queue, expected.spec) \
        and job.state is JobState.PENDING
    assert service.view.versions == from_log.versions == {"job-a": 3}


class Refolder(Recorder):
    """A service that would fold the log again from inside its handling of a request."""

    async def handle_inbox(self, event: Any, delivery: Delivery) -> None:
        await self.cold_fold()


async def test_a_cold_fold_from_a_handler_is_refused_instead_of_waiting_for_itself() -> None:
    store = HeldStore()
    clock = Clock()
    service = Refolder(store, SimpleNamespace(namespace="ns"), clock=clock, monotonic=clock)
    await service.rebuild()
    spec = validate_job_spec({"name": "a", "queue": "q", "gpus_per_replica": 8, "runtime": "sim",
                              "duration_seconds": 60})
    submitted = job_event("a", ev.JobSubmitted, spec=spec)
    with pytest.raises(RuntimeError, match="it would wait for itself"):
        await asyncio.wait_for(service.on_inbox(_delivery("ns.inbox.JobSubmitted", submitted, 1)), 5)
    assert service._handling == 0 and not service._handlers  # counted out again: later cold folds run
    await asyncio.wait_for(service.cold_fold(), 5)
