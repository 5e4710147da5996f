"""`quota_round`: `reserve_quota`'s decisions with the refusals of the order's unwalked tail kept
per (queue, GPUs[, user]) instead of one Pending per waiting job.

Behind full cohorts (Kueue's shape) a round walks a few dozen jobs and refuses thousands for one
reason per class; the quota service reads the compact answer. Every waiting job must get exactly
the decision `reserve_quota` gives it: named in `decisions`, or its class's reason in `rest`.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import corral.core.reservation as reservation
from corral.core import Cluster, Pending, PendingJob, QueueConfig, SchedulerConfig, Snapshot
from corral.core.pipeline import run_round
from corral.core.steps import StepMemos
from tests.unit.core.builders import job, running
from tests.unit.core.test_quota_reclaim_loops import PREEMPTION, SETTINGS, worlds


def expanded(r: reservation.QuotaRound, snap: Snapshot, holding: set[str]) -> dict[str, object]:
    out: dict[str, object] = {d.job_id: d for d in r.decisions}
    for p in snap.pending:
        if p.job.id not in out and p.job.id not in holding:
            out[p.job.id] = Pending(p.job.id, r.reason_of(p.job))
    return out


@SETTINGS
@given(world=worlds(), look_after=st.integers(1, 3))
def test_the_compact_round_decides_every_waiting_job_as_reserve_quota_does(world, look_after):
    cluster, queues, pending, run, holding = world
    snap = Snapshot(1000.0, cluster, queues, tuple(pending), tuple(run))
    saved = reservation._LOOK_AFTER
    reservation._LOOK_AFTER = look_after  # a tail left unwalked after 1-3 refusals in a row
    try:
        full = reservation.reserve_quota(snap, PREEMPTION, reserved=holding)
        compact = reservation.quota_round(snap, PREEMPTION, reserved=holding)
    finally:
        reservation._LOOK_AFTER = saved
    assert expanded(compact, snap, holding) == {d.job_id: d for d in full}
    assert len({d.job_id for d in compact.decisions}) == len(compact.decisions)


def _acts(decisions: list) -> list[tuple[str, str, object]]:
    """Each decision without a Pending's reason: what the round does."""
    return [(type(d).__name__, d.job_id, None if isinstance(d, Pending) else d) for d in decisions]


def _by_job(decisions: list) -> list[tuple[str, str, object]]:
    """`_acts` by job id: an unexplained round lists its decisions queue by queue where the
    order changes none of them (`corral.core.flat_pass`)."""
    return sorted(_acts(decisions), key=lambda a: a[1])


@SETTINGS
@given(world=worlds(), policy=st.sampled_from(["corral", "las", "fair-las"]))
def test_a_round_that_explains_nothing_decides_as_the_explained_one(world, policy):
    """`explain=False` (the simulator's rounds) asks placement for its actions only in the
    play-out: the same Reserve, Revoke and Pending decisions (in an order of their own) and the
    same placements and preemptions, with one memo kept through both as the simulator keeps it."""
    cluster, queues, pending, run, holding = world
    snap = Snapshot(1000.0, cluster, queues, tuple(pending), tuple(run))
    config = SchedulerConfig.named(policy)
    plain = reservation.reserve_quota(snap, config, reserved=holding, explain=True)
    assert _by_job(reservation.reserve_quota(snap, config, reserved=holding, explain=False)) == _by_job(plain)
    memos = StepMemos()
    quiet = run_round(snap, config, holding=holding, memos=memos, explain=False)
    told = run_round(snap, config, holding=holding, memos=memos)
    assert (_by_job(list(quiet.quota)), quiet.placed, quiet.preempts) == (_by_job(list(told.quota)), told.placed,
                                                                           told.preempts)
    assert _acts(list(told.quota)) == _acts(plain)


def test_a_backlog_behind_a_full_ceiling_is_refused_per_class() -> None:
    """The shape the compact answer is for: one queue at its ceiling, a hundred waiting of two
    sizes: a few dozen decisions named, the rest answered by two classes."""
    cluster = Cluster.uniform(2, 8, "H100")
    queues = (QueueConfig("a", guaranteed_gpus=16, max_gpus=16),)
    run = tuple(running(job(f"r{i}", queue="a"), [("n000" if i < 8 else "n001", (i % 8,))]) for i in range(16))
    pending = tuple(PendingJob(job(f"p{i:03d}", queue="a", gpus=1 + i % 2, submit_time=float(i)))
                    for i in range(100))
    snap = Snapshot(1000.0, cluster, queues, pending, run)
    compact = reservation.quota_round(snap, PREEMPTION)
    assert len(compact.decisions) <= reservation._LOOK_AFTER + 1
    assert set(compact.rest) == {("a", 1, None), ("a", 2, None)}
    assert expanded(compact, snap, set()) == {d.job_id: d for d in reservation.reserve_quota(snap, PREEMPTION)}


if __name__ == "__main__":
    pytest.main([__file__])
