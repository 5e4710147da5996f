"""`corral.verdicts.read_verdict` against a real Postgres log, with the services' records written
by hand: what each request is answered with, the duplicates of a submission included."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest

from corral.contracts import events as ev
from corral.contracts.envelope import Event, Reason, job_stream
from corral.contracts.jobspec import JobSpec
from corral.eventstore import ANY, EventStore, Tracking
from corral.services.base import to_new_event
from corral.verdicts import VerdictKind, read_verdict


@pytest.fixture
async def store(postgres_dsn: str) -> AsyncIterator[EventStore]:
    s = await EventStore.open(postgres_dsn, pool_size=2)
    try:
        yield s
    finally:
        await s.close()


def _submitted(job: str, user: str, submission: str | None = None) -> ev.JobSubmitted:
    spec = msgspec.convert({"name": "n", "queue": "q", "replicas": 1, "gpus_per_replica": 1, "runtime": "sim",
                            "duration_seconds": 5, "submission_id": submission}, JobSpec)
    return ev.JobSubmitted.new(stream=job_stream(job), actor=f"user/{user}", job_id=job, user=user, spec=spec,
                               submission_id=submission)


async def _record(store: EventStore, key: str, events: list[Event]) -> None:
    """What admission appends for one request: its events (if any) and its tracking row, at once."""
    batches = {e.stream: (ANY, [to_new_event(x) for x in events if x.stream == e.stream]) for e in events}
    await store.append_multi(batches, tracking=Tracking("admission", key))


async def test_each_request_is_answered_by_what_its_owner_recorded(store: EventStore) -> None:
    first = _submitted("ja", "alice", "nightly")
    admitted = ev.JobAdmitted.new(stream=job_stream("ja"), actor="admission", job_id="ja", causation=first,
                                  queue="q", priority=500, replicas=1, gpus_per_replica=1)
    await _record(store, "k-first", [first, admitted])
    verdict = await read_verdict(store, first, "k-first", 5)
    assert (verdict.kind, verdict.event, verdict.job_id) == (VerdictKind.DONE, admitted, "ja")

    # alice again, under another job id: handled, nothing recorded; answered with her first job
    again = _submitted("ja2", "alice", "nightly")
    await _record(store, "k-again", [])
    verdict = await read_verdict(store, again, "k-again", 5)
    assert (verdict.kind, verdict.job_id) == (VerdictKind.DONE, "ja")

    # the same job id again, no submission id: the job of that id, as it is hers
    same = _submitted("ja", "alice")
    await _record(store, "k-same", [])
    verdict = await read_verdict(store, same, "k-same", 5)
    assert (verdict.kind, verdict.event, verdict.job_id) == (VerdictKind.DONE, admitted, "ja")

    # bob with alice's job id: nothing of alice's job answers him
    bobs = _submitted("ja", "bob")
    await _record(store, "k-bob", [])
    verdict = await read_verdict(store, bobs, "k-bob", 5)
    assert verdict.kind is VerdictKind.UNCHANGED and verdict.event is None

    # a cancel refused; one not handled yet
    cancel = ev.JobCancelRequested.new(stream=job_stream("ja"), actor="user/bob", job_id="ja", user="bob")
    denied = ev.AccessDenied.new(stream=job_stream("ja"), actor="admission", causation=cancel, user="bob",
                                 request=cancel.type, job_id="ja",
                                 reason=Reason(code="NOT_OWNER", message="bob may not cancel a job of alice"))
    await _record(store, cancel.event_id, [denied])
    refused = await read_verdict(store, cancel, cancel.event_id, 5)
    assert refused.kind is VerdictKind.REFUSED and refused.reason is not None and refused.reason.code == "NOT_OWNER"
    later = ev.JobCancelRequested.new(stream=job_stream("ja"), actor="user/alice", job_id="ja", user="alice")
    assert (await read_verdict(store, later, later.event_id, 0.2)).kind is VerdictKind.NO_VERDICT
