"""The service base's pure parts: the one reason throttle and the envelope `new_event` fills.

`ReasonThrottle` decides when a waiting job's reason is worth a PlacementPending (quota and
placement both go through `Service.pending_event`); `Service.new_event` fills stream, actor,
correlation and time from the service (its injected clock). No NATS or Postgres: the service is
built with stand-ins for the store and the bus, which these methods never touch.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from corral import core
from corral.contracts import events as ev
from corral.contracts.envelope import Reason
from corral.projection import JobView
from corral.services.base import Service
from corral.services.reason_throttle import ReasonThrottle
from tests.unit.services.doubles import Clock

# (recorded reason, said before how many seconds ago or None, new code, new message, news?)
CASES = [
    (None, None, "QUOTA_EXCEEDED", "uses 7 of 8", True),  # nothing recorded yet
    (("QUOTA_EXCEEDED", "uses 7 of 8"), 1.0, "QUOTA_EXCEEDED", "uses 7 of 8", False),  # same words
    (("QUOTA_EXCEEDED", "uses 7 of 8"), None, "QUOTA_EXCEEDED", "uses 6 of 8", True),  # not said by us yet
    (("QUOTA_EXCEEDED", "uses 7 of 8"), 1.0, "QUOTA_EXCEEDED", "uses 6 of 8", False),  # numbers only, soon
    (("QUOTA_EXCEEDED", "uses 7 of 8"), 5.0, "QUOTA_EXCEEDED", "uses 6 of 8", True),  # numbers only, later
    (("QUOTA_EXCEEDED", "uses 7 of 8"), 0.0, "GANG_DOES_NOT_FIT", "needs 2x8", True),  # another code: at once
]


@pytest.mark.parametrize(("recorded", "ago", "code", "message", "news"), CASES)
def test_the_reason_throttle(recorded: tuple[str, str] | None, ago: float | None, code: str, message: str,
                             news: bool) -> None:
    clock = Clock()
    throttle = ReasonThrottle(clock, refresh_seconds=5.0)
    if ago is not None:
        clock.now -= ago
        assert throttle.news("j", None, "ANY", "first")
        clock.now += ago
    wire = Reason(code=recorded[0], message=recorded[1]) if recorded else None
    assert throttle.news("j", wire, code, message) is news


def test_the_throttle_forgets_jobs_that_ended() -> None:
    throttle = ReasonThrottle(Clock())
    for job in ("a", "b", "c"):
        throttle.news(job, None, "X", "x")
    throttle.retain({"b"})
    assert len(throttle) == 1


def service(clock: Clock, monotonic: Clock) -> Service:
    stand_in: Any = object()
    return Service(stand_in, stand_in, clock=clock, monotonic=monotonic)


def test_new_event_fills_the_envelope_from_the_service() -> None:
    svc = service(Clock(1_700_000_000.0), Clock())
    svc.name = "quota"  # type: ignore[misc]
    reserved = svc.new_event(ev.QuotaReserved, job_id="j1", queue="a", gpus=8, borrowed=0)
    assert (reserved.stream, reserved.actor, reserved.correlation_id) == ("job-j1", "quota", "j1")
    assert reserved.occurred_at == datetime.fromtimestamp(1_700_000_000.0, UTC)
    request = svc.new_event(ev.PreemptRequested, victim_job_id="v", for_job_id="p",
                            deadline=datetime.fromtimestamp(0, UTC), reason=Reason(code="X", message="x"))
    assert (request.stream, request.correlation_id) == ("job-v", "v")
    lost = svc.new_event(ev.NodeLost, stream="node-n1", node="n1", reason=Reason(code="X", message="x"))
    assert lost.correlation_id == "n1"
    followed = svc.new_event(ev.GpusAllocated, stream="node-n1", causation=reserved, node="n1", job_id="j1",
                             gpus=[0], attempt=0)
    assert (followed.correlation_id, followed.causation_id) == ("j1", reserved.event_id)
    with pytest.raises(ValueError, match="give a stream"):
        svc.new_event(ev.NodeLost, node="n1", reason=Reason(code="X", message="x"))


def test_pending_event_is_throttled_on_the_injected_monotonic_clock() -> None:
    monotonic = Clock()
    svc = service(Clock(), monotonic)
    job = JobView(job_id="j1")
    first = svc.pending_event(job, core.Reason(core.ReasonCode.QUOTA_EXCEEDED, "uses 7 of 8"))
    assert first is not None and first.actor == "service" and first.reason.code == "QUOTA_EXCEEDED"
    job.reason = first.reason
    assert svc.pending_event(job, core.Reason(core.ReasonCode.QUOTA_EXCEEDED, "uses 6 of 8")) is None
    monotonic.now += svc.reason_refresh_seconds
    assert svc.pending_event(job, core.Reason(core.ReasonCode.QUOTA_EXCEEDED, "uses 6 of 8")) is not None


def test_a_reason_said_word_for_word_is_never_news_and_costs_no_clock_read() -> None:
    """Quota's round asks this of every waiting job (thousands in a backlog): a reason the log
    already holds, code and message, is answered before the throttle and its clock."""

    class NoClock:
        def __call__(self) -> float:
            raise AssertionError("the throttle's clock was read for a reason said already")

    svc = service(Clock(), NoClock())  # type: ignore[arg-type]
    job = JobView(job_id="j1")
    job.reason = Reason(code="MAX_GPUS_EXCEEDED", message="uses 120 of max 120")
    assert svc.pending_event(job, core.Reason(core.ReasonCode.MAX_GPUS_EXCEEDED, "uses 120 of max 120")) is None


async def test_an_event_folded_already_is_not_decoded_again() -> None:
    """A service's own appends come back over the bus with a stream version it has folded: they
    are skipped before decoding (bytes that do not decode show it); a newer version is decoded."""
    from corral.bus import Delivery, Poison

    svc = service(Clock(), Clock())
    svc.view.versions["job-a"] = 3

    def delivery(version: int) -> Delivery:
        return Delivery(subject="ns.events.JobAdmitted", data=b"not an event",
                        headers={"Corral-Stream": "job-a", "Corral-Stream-Version": str(version)},
                        delivery_count=1, stream="ns-events", stream_sequence=version, consumer_sequence=version,
                        timestamp=None)

    for folded in (1, 3):
        await svc.on_event(delivery(folded))
    with pytest.raises(Poison):
        await svc.on_event(delivery(4))


async def test_a_batch_of_events_holds_every_event_after_one_that_met_an_unavailable_dependency() -> None:
    """`on_events` folds a fetched batch in order: a bad event is its own failure and the rest are
    folded; an event that meets a dependency down is held together with every later one (the
    consumer hands them back in order once it answers)."""
    from corral.bus import Delivery, Poison, Unavailable

    svc = service(Clock(), Clock())
    seen: list[int] = []

    async def on_event(delivery: Delivery) -> None:
        seen.append(delivery.stream_sequence)
        if delivery.stream_sequence == 2:
            raise Poison("undecodable")
        if delivery.stream_sequence == 4:
            raise Unavailable("Postgres")

    svc.on_event = on_event  # type: ignore[method-assign]
    batch = [Delivery(subject="ns.events.JobAdmitted", data=b"", headers={}, delivery_count=1, stream="ns-events",
                      stream_sequence=n, consumer_sequence=n, timestamp=None) for n in range(1, 7)]
    outcomes = await svc.on_events(batch)
    assert seen == [1, 2, 3, 4]
    assert outcomes[0] is None and outcomes[2] is None and isinstance(outcomes[1], Poison)
    assert all(isinstance(o, Unavailable) for o in outcomes[3:])
