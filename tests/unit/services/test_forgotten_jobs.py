"""Admission and placement forget ended jobs (`forgets_ended_jobs`) and answer about them from the log.

- every deciding service's fold keeps no ended job, so its memory is O(active jobs + nodes);
- on any log, a job the fold forgot, read back from its stream (`Service.forgotten_job`), is the
  job the whole fold holds: what placement checks a late report against (which node holds which
  rank of which attempt) and dates it by (its placement and run) are the same, and a node's late
  report is refused or recorded exactly as the whole fold would.

No NATS or Postgres: the log is a list, read by stream as `EventStore.read_stream` reads it.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.contracts import events as ev
from corral.contracts.envelope import Event, Reason, job_stream
from corral.contracts.registry import encode
from corral.eventstore.records import StoredEvent
from corral.projection import ClusterView
from corral.services.admission.service import Admission
from corral.services.base import Service
from corral.services.placement.report_auth import report_refused
from corral.services.placement.service import Placement
from corral.services.preemption.service import Preemption
from corral.services.quota.service import Quota
from tests.unit.readmodel_logs import varied_log


class ListStore:
    """The log as a list: `read_stream` as the event store answers it."""

    def __init__(self, events: list[Event]) -> None:
        self.stored: list[StoredEvent] = []
        versions: dict[str, int] = {}
        for position, e in enumerate(events, 1):
            versions[e.stream] = versions.get(e.stream, 0) + 1
            self.stored.append(StoredEvent(
                event_id=e.event_id, stream=e.stream, type=e.type, schema_version=e.schema_version, data=encode(e),
                correlation_id=e.correlation_id, causation_id=e.causation_id, occurred_at=e.occurred_at,
                version=versions[e.stream], position=position, recorded_at=e.occurred_at))

    async def read_stream(self, stream: str, from_version: int = 1) -> list[StoredEvent]:
        return [s for s in self.stored if s.stream == stream and s.version >= from_version]


def service(cls: type[Service], events: list[Event]) -> Service:
    stand_in: Any = object()
    svc = cls(ListStore(events), stand_in)  # type: ignore[arg-type]
    for s in svc.store.stored:  # type: ignore[attr-defined]
        svc._fold_stored(s)
    return svc


def whole(events: list[Event]) -> ClusterView:
    view = ClusterView()
    for position, event in enumerate(events, 1):
        view.apply(event, None, position)
    return view


def test_every_deciding_service_forgets_ended_jobs() -> None:
    events = varied_log(40, seed=3)
    ended = set(whole(events).jobs) - set(whole(events).active)
    assert ended
    for cls in (Admission, Quota, Placement, Preemption):
        svc = service(cls, events)
        assert svc.forgets_ended_jobs, cls
        assert not ended & set(svc.view.jobs), cls
        assert ended <= svc.view.forgotten, cls


@settings(max_examples=12, deadline=None)
@given(jobs=st.integers(1, 25), seed=st.integers(0, 10_000))
def test_a_forgotten_job_read_from_the_log_is_the_whole_folds(jobs: int, seed: int) -> None:
    events = varied_log(jobs, seed=seed)
    full = whole(events)
    placement = service(Placement, events)

    async def check() -> None:
        for job_id in sorted(placement.view.forgotten):
            read = await placement.forgotten_job(job_id)
            assert read is not None
            j = full.jobs[job_id]
            assert (read.state, read.attempt, read.ranks, read.fences, read.user, read.spec) == \
                (j.state, j.attempt, j.ranks, j.fences, j.user, j.spec)
            assert (read.submitted_at, read.placed_at, read.running_since) == \
                (j.submitted_at, j.placed_at, j.running_since)
            # a late report of any rank, from any node, is judged as the whole fold judges it
            for node in sorted(full.nodes):
                for rank in range(2):
                    for attempt in range(max(j.attempt, 0) + 1):
                        late = ev.WorkerExited.new(
                            stream=job_stream(job_id), actor=f"node-agent/{node}", job_id=job_id, rank=rank,
                            node=node, exit_code=0, attempt=attempt, reason=Reason(code="EXITED", message="late"),
                            now=datetime(2030, 1, 1, tzinfo=UTC))
                        assert report_refused(late, node, placement.view, read) == report_refused(late, node, full)
        assert await placement.forgotten_job("never-seen") is None
        for job_id in placement.view.jobs:  # a job it holds is not read from the log
            assert await placement.forgotten_job(job_id) is None

    asyncio.run(check())
