"""Placement says a job's first reason only once the job has waited for GPUs past a grace
(`corral.services.placement.first_reason`): a job placed within it gets no PlacementPending, and a
job still unplaced then gets its reason at once, with no event meanwhile (a timer wakes placement).

Why: a job quota has just reserved often waits a few milliseconds for GPUs still fenced and is
placed in the next cycle; a PlacementPending for that wait costs an append, a relay publish and
deliveries that nobody reads. No NATS or Postgres: placement's clocks are injected, its appends
folded as a real append folds them.
"""

from __future__ import annotations

import asyncio

import pytest

from corral.contracts import events as ev
from corral.contracts.envelope import Reason, node_stream
from corral.services.placement.first_reason import FirstReasonGrace
from tests.unit.services.doubles import Clock, FoldingPlacement, one_node, waiting
from tests.unit.services.job_events import job_event


async def _full(clock: Clock) -> FoldingPlacement:
    """One node of 8 GPUs, all of them held by job `a`."""
    placement = FoldingPlacement(clock)
    one_node(placement, guaranteed_gpus=16)
    placement.fold(*waiting("a"))
    await placement._place(clock())
    assert placement.view.jobs["a"].holding
    return placement


def test_the_grace_holds_a_first_reason_back_until_the_job_has_waited_it() -> None:
    clock = Clock()
    grace = FirstReasonGrace(clock, grace_seconds=1.0)
    grace.reserved("j")
    clock.now += 0.4
    assert not grace.may_say("j") and grace.due_in() == pytest.approx(0.6) and grace.due() == set()
    clock.now += 0.6
    assert grace.due() == {"j"} and grace.due_in() == 0.0
    assert grace.may_say("j") and grace.due_in() is None, "said: no longer held back"
    grace.forget("j")
    assert len(grace) == 0


def test_a_job_placement_never_saw_reserved_waits_from_when_it_is_first_asked_about() -> None:
    clock = Clock()
    grace = FirstReasonGrace(clock, grace_seconds=1.0)
    assert not grace.may_say("j")
    clock.now += 1.0
    assert grace.may_say("j")


async def test_a_job_placed_within_its_grace_gets_no_placement_pending() -> None:
    clock = Clock()
    placement = await _full(clock)
    clock.now += 0.1
    placement.fold(*waiting("b"))
    clock.now += placement.tick_seconds  # the tick's cycle: b does not fit, 1 tick after its reservation
    placement._grace.grace_seconds = 2.0
    await placement._place(clock())
    assert placement.reasons_of("b") == [] and placement.view.jobs["b"].reason is None
    gang = placement.view.jobs["a"]
    placement.fold(
        job_event("a", ev.GangReleased, attempt=gang.attempt, reason=Reason(code="COMPLETED", message="done")),
        ev.GpusReleased.new(stream=node_stream("n1"), actor="placement", correlation_id="a", job_id="a",
                            node="n1", attempt=gang.attempt, gpus=list(range(8))))
    clock.now += 0.1
    await placement._place(clock())
    assert placement.view.jobs["b"].holding and placement.reasons_of("b") == []


async def test_a_job_still_unplaced_after_its_grace_has_its_reason_said_with_no_event_meanwhile() -> None:
    clock = Clock()
    placement = await _full(clock)
    placement.fold(*waiting("b"))
    clock.now += placement.tick_seconds / 2
    placement._place_dirty = True
    placement._placed_at = float("-inf")  # a cycle now (the tick's)
    await placement._place(clock())
    assert placement.reasons_of("b") == [], "within its grace: nothing said"
    timer = placement._grace_timer
    loop = asyncio.get_running_loop()
    assert timer is not None and abs(timer.when() - (loop.time() + 0.5 + placement.grace_batch_seconds)) < 0.04, \
        "a timer wakes placement when the grace is over"
    clock.now += 0.5  # well within the tick since the last cycle, and no event came
    assert not placement._place_dirty
    await placement._place(clock())
    assert placement.reasons_of("b") == ["GANG_DOES_NOT_FIT"] and placement.view.jobs["b"].reason is not None
    placement._grace_timer.cancel()


async def test_a_later_reason_is_the_throttles_not_the_grace() -> None:
    """A job placement has said a reason of since quota reserved it is past its first reason: a
    new code is news at once (the reason throttle), whatever the grace."""
    from corral import core

    clock = Clock()
    placement = await _full(clock)
    placement.fold(*waiting("b"))
    placement._grace.grace_seconds = 60.0
    job = placement.view.jobs["b"]
    assert placement._reason_event(job, core.Reason(core.ReasonCode.GANG_DOES_NOT_FIT, "no room")) is None
    job.reason = Reason(code="GANG_DOES_NOT_FIT", message="no room")
    said = placement._reason_event(job, core.Reason(core.ReasonCode.RESERVED_FOR, "for c"))
    assert said is not None and said.reason.code == "RESERVED_FOR"


def test_a_reservation_clears_the_last_reason_and_says_when_it_was_made() -> None:
    """The reason a job waited with before quota reserved it (quota's, a requeue's) is no longer
    why it waits: the fold says placement has it (`JobView.deciding`) until placement says more."""
    from corral.projection import ClusterView

    view = ClusterView()
    events = waiting("b")
    view.apply(events[0])
    view.apply(events[1])
    view.apply(job_event("b", ev.PlacementPending, reason=Reason(code="MAX_GPUS_EXCEEDED", message="8 of 8")))
    assert not view.jobs["b"].deciding
    view.apply(events[2])
    job = view.jobs["b"]
    assert job.reason is None and job.deciding and job.quota_reserved_at == events[2].occurred_at
    view.apply(job_event("b", ev.PlacementPending, reason=Reason(code="GANG_DOES_NOT_FIT", message="no room")))
    assert not view.jobs["b"].deciding
    view.apply(job_event("b", ev.QuotaReleased, queue="q", gpus=8, reason=Reason(code="X", message="x")))
    assert view.jobs["b"].quota_reserved_at is None and not view.jobs["b"].deciding


async def test_placement_says_a_reason_with_only_new_numbers_again_after_30_seconds() -> None:
    """GANG_DOES_NOT_FIT's numbers change with every placement: the same code is said again at
    most every 30 s (a new code at once)."""
    from corral import core

    clock = Clock()
    placement = await _full(clock)
    placement.fold(*waiting("b"))
    job = placement.view.jobs["b"]
    clock.now += 1.0
    said = placement._reason_event(job, core.Reason(core.ReasonCode.GANG_DOES_NOT_FIT, "at most 6 free"))
    assert said is not None
    placement.fold(said)
    clock.now += 29.0
    assert placement._reason_event(job, core.Reason(core.ReasonCode.GANG_DOES_NOT_FIT, "at most 5 free")) is None
    clock.now += 1.0
    assert placement._reason_event(job, core.Reason(core.ReasonCode.GANG_DOES_NOT_FIT, "at most 5 free")) is not None
