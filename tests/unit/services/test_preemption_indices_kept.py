"""Preemption's kept indices equal the pass over every active job they replaced.

The problem (services/preemption/service.py): `_requeues` listed the released victims from every
active job at every reconcile, and `_requests` the waiting jobs before every victim search; with
~10,000 jobs waiting for quota that pass was 39% of the process's time (py-spy, Kueue shape). Now
both are kept for the job of each folded event. Any interleaving of jobs' lifecycles (quota's
harness, plus releases for preemption) is folded as the service folds it, and after every event
the indices must hold exactly the jobs the whole pass finds.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.contracts import events as ev
from corral.contracts.envelope import Reason
from corral.contracts.lifecycle import LifecycleCode
from corral.core.preemption import Preemptors
from corral.projection import JobState
from corral.services.preemption.service import Preemption
from tests.unit.services.test_quota_round_inputs_kept import OPS, T0, event, interleaved

PREEMPTED = Reason(code=LifecycleCode.PREEMPTED.value, message="preempted")
lifecycles = st.lists(st.tuples(st.booleans(), st.lists(st.sampled_from((*OPS, "release_preempted", "ask_requeue")),
                                                      max_size=10)),
                      min_size=1, max_size=6)


def whole_pass(preemption: Preemption) -> tuple[set[str], set[str], set[str]]:
    """What `_requeues`, `_requests` and `_asked_to_move` listed from every active or running job before."""
    active = list(preemption.view.active.values())
    return ({j.job_id for j in active if j.state is JobState.REQUEUING and j.reason is not None
             and j.reason.code == LifecycleCode.PREEMPTED},
            {j.job_id for j in active if j.state is JobState.PENDING and j.spec is not None},
            {j.job_id for j in preemption.view.running_jobs()
             if j.requeue_request is not None and j.requeue_attempt == j.attempt})


@settings(max_examples=300, deadline=None)
@given(lifecycles, st.randoms(use_true_random=False))
def test_the_kept_indices_equal_the_whole_pass_after_every_event(jobs: list[tuple[bool, list[str]]],
                                                                 rng: Any) -> None:
    stand_in: Any = object()
    preemption = Preemption(stand_in, stand_in)
    preemption.preemptors()  # kept from here on, as after the first victim search
    for op, job, at in interleaved(jobs, rng):
        view = preemption.view.jobs.get(job)
        if op == "release_preempted":
            e = ev.GangReleased.new(stream=f"job-{job}", actor="test", correlation_id=job, now=at, job_id=job,
                                    reason=PREEMPTED, attempt=view.attempt if view is not None else 0)
        elif op == "ask_requeue":
            e = ev.JobRequeueRequested.new(stream=f"job-{job}", actor="test", correlation_id=job, now=at, job_id=job)
        else:
            e = event(op, job, view, at)
        if preemption.view.apply(e) is not None:  # as Service._fold_stored: the view, then `folded`
            preemption.folded(e)
        requeue, waiting, asked = whole_pass(preemption)
        assert set(preemption._to_requeue) == requeue, op
        assert set(preemption._requeue_asked) == asked, op
        assert set(preemption._waiting) == waiting, op
        assert all(preemption._waiting[j] is preemption.view.jobs[j] for j in waiting), op
        fresh = Preemptors(preemption.view.jobs[j].core_pending() for j in waiting)
        assert preemption.preemptors().waiting() == fresh.waiting(), op


def _walk(preemption: Preemption, ops: tuple[str, ...]) -> list[tuple[bool, bool]]:
    """Fold job "j" through `ops` (a second apart; "release_preempted": its gang released as
    preempted); after each, whether it is in the to-requeue and the waiting index."""
    at = T0
    seen: list[tuple[bool, bool]] = []
    for op in ops:
        at += timedelta(seconds=1)
        view = preemption.view.jobs.get("j")
        e = (ev.GangReleased.new(stream="job-j", actor="test", correlation_id="j", now=at, job_id="j",
                                 reason=PREEMPTED, attempt=0) if op == "release_preempted"
             else event(op, "j", view, at))
        preemption.view.apply(e)
        preemption.folded(e)
        seen.append(("j" in preemption._to_requeue, "j" in preemption._waiting))
    return seen


def test_a_released_victim_is_requeued_and_a_waiting_job_listed() -> None:
    """The property above is not vacuous: both indices fill in a plain lifecycle."""
    stand_in: Any = object()
    preemption = Preemption(stand_in, stand_in)
    seen = _walk(preemption, ("submit", "admit", "reserve", "place", "running", "release_preempted"))
    assert seen[1] == (False, True) and seen[-1] == (True, False)


def test_a_running_job_asked_to_requeue_is_asked_to_move_and_others_are_not_looked_at() -> None:
    """The asked index is not vacuous, and without a node drained with --evict only it is read."""
    stand_in: Any = object()
    preemption = Preemption(stand_in, stand_in)
    at = T0
    for job in ("j", "k"):
        for op in ("submit", "admit", "reserve", "place", "running"):
            at += timedelta(seconds=1)
            e = event(op, job, preemption.view.jobs.get(job), at)
            preemption.view.apply(e)
            preemption.folded(e)
    asked = ev.JobRequeueRequested.new(stream="job-k", actor="test", correlation_id="k", now=at, job_id="k")
    preemption.view.apply(asked)
    assert set(preemption._requeue_asked) == {"k"}
    moved = preemption._asked_to_move()
    assert list(moved) == ["job-k"] and moved["job-k"][0].victim_job_id == "k"


async def test_a_requeue_that_lost_a_race_is_decided_again_at_once() -> None:
    """A victim's JobRequeued is guarded by the versions preemption has seen; quota's QuotaReleased,
    which it is not sent, often lands first: the append loses, the stream is re-read and the next
    reconcile is due at once (not at the next tick), where the requeue goes through."""
    from corral.eventstore import ConcurrencyError

    class Store:
        def __init__(self) -> None:
            self.appended: list[dict[str, Any]] = []
            self.lose = True

        async def append_multi(self, plan: dict[str, Any], tracking: Any = None) -> None:
            if self.lose:
                self.lose = False
                stream, (expected, _) = next(iter(plan.items()))
                raise ConcurrencyError(stream, expected, expected + 1)
            self.appended.append(plan)

        async def read_stream(self, stream: str, after: int = 1) -> list[Any]:
            return []

    store = Store()
    stand_in: Any = object()
    preemption = Preemption(store, stand_in)  # type: ignore[arg-type]
    _walk(preemption, ("submit", "admit", "place", "running", "release_preempted"))
    preemption.changed.clear()
    await preemption.reconcile()
    assert not store.appended and preemption.changed.is_set()
    preemption.changed.clear()
    await preemption.reconcile()
    assert [e.type for plan in store.appended for _, events in plan.values() for e in events] \
        == [ev.JobRequeued.type_name()]
