"""Quota and preemption must not work against each other: a gang is never quota-reserved,
placed, then reclaimed at once, over and over.

The services take their decisions one after the other on the same state: quota reserves
(`reserve_quota`), placement places what holds quota (`schedule` with the placement service's
config), preemption picks victims (`schedule` with the full config). A decision round here is
exactly that sequence; no job that quota reserved in a round may be a victim of the preemption
decision of the same round.
"""

from __future__ import annotations

import dataclasses
import os
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import (
    Cluster,
    Pending,
    PendingJob,
    Place,
    Placement,
    Preempt,
    QueueConfig,
    ReasonCode,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    schedule,
)
from corral.core.pipeline import run_round
from corral.core.reservation import Reserve, Revoke
from tests.unit.core.builders import job, running
from tests.unit.core.test_core_properties import clusters, queue_trees, random_job

# the placement and preemption services' configs (services/placement, services/preemption)
PLACEMENT = SchedulerConfig(preemption=False, reclaim=False, quotas=False)
PREEMPTION = SchedulerConfig()


@dataclasses.dataclass
class Round:
    quota: list[Reserve | Pending | Revoke]
    placed: dict[str, Placement]
    preempts: list[Preempt]

    @property
    def reserved(self) -> set[str]:
        return {d.job_id for d in self.quota if isinstance(d, Reserve)}

    @property
    def revoked(self) -> set[str]:
        return {d.job_id for d in self.quota if isinstance(d, Revoke)}

    @property
    def victims(self) -> set[str]:
        return {v for d in self.preempts for v in d.victims}


def decision_round(
    now: float,
    cluster: Cluster,
    queues: tuple[QueueConfig, ...],
    pending: list[PendingJob],
    run: list[RunningJob],
    holding: set[str] = frozenset(),  # type: ignore[assignment]
) -> Round:
    """Quota, then placement over every job holding quota, then preemption on the state that leaves
    (`corral.core.pipeline.run_round`, the services' round)."""
    r = run_round(Snapshot(now, cluster, queues, tuple(pending), tuple(run)), PREEMPTION, holding=holding)
    return Round(list(r.quota), {d.job_id: d.placement for d in r.placed}, list(r.preempts))


# -- the reported loop ------------------------------------------------------------------------------


def _lender_and_borrower() -> tuple[Cluster, tuple[QueueConfig, ...], list[RunningJob]]:
    """7 nodes x 8 GPUs. `lender` is guaranteed 48 GPUs and runs nothing; `borrower` (no
    guarantee) borrows 4 nodes for four long single-node jobs (no estimates). 3 nodes are free."""
    cluster = Cluster.uniform(7, 8, "H100")
    queues = (QueueConfig("lender", 48), QueueConfig("borrower", 0))
    run = [running(job(f"b{i}", 1, 8, "borrower"), [(f"n00{i}", tuple(range(8)))], start=0.0) for i in range(4)]
    return cluster, queues, run


def test_a_borrowing_3x8_gang_is_not_reserved_while_the_lenders_guaranteed_job_would_reclaim_it():
    """The lender's 4x8 job does not fit on the 3 free nodes; its EASY reservation expects to start
    only when the borrower's jobs end (no estimates), so placement backfills the borrower's 3x8 gang
    (estimated 1 h) on the free nodes, and preemption then reclaims the gang at once: it is the
    cheapest victim, with no work to lose. Before the fix quota reserved the gang."""
    cluster, queues, run = _lender_and_borrower()
    lender = PendingJob(job("l1", 4, 8, "lender", submit_time=900.0))
    gang = PendingJob(job("g", 3, 8, "borrower", submit_time=100.0, estimated_runtime_seconds=3600.0))
    r = decision_round(1000.0, cluster, queues, [lender, gang], run)
    assert not (r.reserved & r.victims), f"reserved then reclaimed in the same round: {r.reserved & r.victims}"
    assert "g" not in r.reserved
    why = next(d.reason for d in r.quota if isinstance(d, Pending) and d.job_id == "g")
    assert why.code is ReasonCode.RESERVED_FOR and why.detail("reserved_for") == "l1", why
    # the lender still gets its guarantee: it reclaims one of the borrower's older jobs
    assert r.reserved == {"l1"}
    assert [(d.job_id, d.victims) for d in r.preempts] == [("l1", ("b0",))]


def test_the_loop_does_not_come_round_again():
    """Rounds of quota, placement and preemption (victims release at once and wait again without
    quota) while the lender submits a guaranteed job of 4, 5 or 6 x8 GPUs every round (each runs
    5 s) for 24 rounds: before the fix the gang was reserved, placed and reclaimed in the same round
    six times (rounds 0, 2, 6, 13, 20 and 27) and kept its GPUs from round 30, when the lender's
    backlog was gone. Now it is never reclaimed at once, and it starts in round 30 all the same."""
    cluster, queues, run0 = _lender_and_borrower()
    run = {r.job.id: r for r in run0}
    pending = {"g": PendingJob(job("g", 3, 8, "borrower", submit_time=100.0, estimated_runtime_seconds=3600.0))}
    holding: set[str] = set()
    reclaimed_at_once: list[tuple[int, str]] = []
    gang_started: list[int] = []
    for n in range(60):
        now = 1000.0 + 10.0 * n
        for r in [r for r in run.values() if (end := r.expected_end()) is not None and end <= now]:
            del run[r.job.id]
        if n < 24:
            lj = job(f"l{n}", (4, 5, 6)[n % 3], 8, "lender", submit_time=now, estimated_runtime_seconds=5.0)
            pending[lj.id] = PendingJob(lj)
        rnd = decision_round(now, cluster, queues, list(pending.values()), list(run.values()), holding)
        holding |= rnd.reserved
        for i, placement in rnd.placed.items():
            p = pending.pop(i)
            holding.discard(i)
            run[i] = RunningJob(p.job, placement, now, preempted_by=p.preempted_by)
            if i == "g":
                gang_started.append(n)
        for d in rnd.preempts:
            for v in d.victims:
                r = run.pop(v)
                if r.start_time == now:
                    reclaimed_at_once.append((n, v))
                pending[v] = PendingJob(r.job, r.attained(now), r.preempted_by | {d.job_id})
    assert reclaimed_at_once == []
    assert gang_started and gang_started[0] <= 30, gang_started  # it borrows what the lender leaves idle


# -- the property ---------------------------------------------------------------------------------

SETTINGS = settings(
    max_examples=int(os.environ.get("CORE_PROPERTY_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@st.composite
def worlds(draw: st.DrawFn) -> tuple[Cluster, tuple[QueueConfig, ...], list[PendingJob], list[RunningJob], set[str]]:
    """A random queue tree (guarantees, max, lend limits, weights), jobs running on it (some
    borrowing, some asked to checkpoint), jobs waiting, some of them holding quota already."""
    cluster = draw(clusters(ready_only=draw(st.booleans())))
    queues = draw(queue_trees(max(cluster.usable_gpus, 1)))
    rng = random.Random(draw(st.integers(0, 2**16)))
    names = [q.name for q in queues]
    simple = draw(st.booleans())
    now = 1000.0
    # fill the cluster with running jobs through the placement config (any queue, borrowing or not)
    run: list[RunningJob] = []
    for n in range(draw(st.integers(0, 10))):
        j = random_job(rng, n, rng.uniform(0, now), names, simple)
        snap = Snapshot(now, cluster, queues, (PendingJob(j),), tuple(run))
        for d in schedule(snap, PLACEMENT):
            if isinstance(d, Place):
                start = rng.choice([0.0, now - 100.0, now - 5.0])
                run.append(
                    RunningJob(
                        j,
                        d.placement,
                        start,
                        preempting=rng.random() < 0.1,
                        attained_gpu_seconds=rng.choice([0.0, 5000.0]),
                    )
                )
    pending = [
        PendingJob(random_job(rng, 100 + n, rng.uniform(0, now), names, simple)) for n in range(draw(st.integers(1, 8)))
    ]
    holding = {p.job.id for p in pending if rng.random() < 0.2}
    return cluster, queues, pending, run, holding


def _assert_reservations_within_quota(cluster, queues, pending, run, holding, r) -> None:
    from corral.core.ordering import order_pending, tree_for
    from corral.core.quota import QueueUsage, quota_check

    snap = Snapshot(1000.0, cluster, queues, tuple(pending), tuple(run))
    tree = tree_for(snap, PREEMPTION)
    usage = QueueUsage.of(tree, snap.running)
    for p in pending:
        if p.job.id in holding and p.job.id not in r.revoked and tree.known(p.job.queue):
            usage.add(p.job.queue, p.job.total_gpus)
    assert r.revoked <= holding
    why = {d.job_id: d.reason.code for d in r.quota if isinstance(d, Pending)}
    quota_codes = (ReasonCode.QUOTA_EXCEEDED, ReasonCode.MAX_GPUS_EXCEEDED, ReasonCode.QUEUE_UNKNOWN)
    waiting = Snapshot(1000.0, cluster, queues, tuple(p for p in pending if p.job.id not in holding), tuple(run))
    for p in order_pending(waiting, PREEMPTION, tree=tree):
        blocked = quota_check(snap, p.job, usage, tree=tree)
        if p.job.id in r.reserved:
            assert blocked is None, (p.job.id, blocked)
            usage.add(p.job.queue, p.job.total_gpus)
        elif why[p.job.id] in quota_codes:
            assert blocked is not None, (p.job.id, why[p.job.id])


def _old_reservations(cluster, queues, pending, run, holding) -> set[str]:
    """What quota reserved before the fix: the quota check alone."""
    from corral.core.ordering import order_pending, tree_for
    from corral.core.quota import QueueUsage, quota_check

    snap = Snapshot(1000.0, cluster, queues, tuple(pending), tuple(run))
    tree = tree_for(snap, PREEMPTION)
    usage = QueueUsage.of(tree, snap.running)
    for p in pending:
        if p.job.id in holding and tree.known(p.job.queue):
            usage.add(p.job.queue, p.job.total_gpus)
    waiting = Snapshot(1000.0, cluster, queues, tuple(p for p in pending if p.job.id not in holding), tuple(run))
    out = set()
    for p in order_pending(waiting, PREEMPTION, tree=tree):
        if quota_check(snap, p.job, usage, tree=tree) is None:
            usage.add(p.job.queue, p.job.total_gpus)
            out.add(p.job.id)
    return out


@SETTINGS
@given(world=worlds())
def test_no_job_is_preempted_in_the_round_quota_reserved_it(world):
    cluster, queues, pending, run, holding = world
    r = decision_round(1000.0, cluster, queues, pending, run, holding)
    assert not (r.reserved & r.victims), (
        f"reserved and preempted in the same round: {sorted(r.reserved & r.victims)}; {r.preempts}"
    )
    # nor is a job that held quota from earlier rounds started and preempted in the same round:
    # its reservation is revoked instead (it would be started and taken back at once)
    kept = set(holding) - r.revoked
    assert not (kept & set(r.placed) & r.victims), (sorted(kept & set(r.placed) & r.victims), r.preempts)
    # in the quota order, each reservation passes the quota check with those before it counted,
    # and a job waiting for a quota reason fails it so: a job held back by the rule (with its own
    # reason) counts for nothing, so the jobs its quota blocked are checked again
    _assert_reservations_within_quota(cluster, queues, pending, run, holding, r)


@SETTINGS
@given(world=worlds())
def test_a_job_no_waiting_job_can_preempt_is_reserved_on_its_quota_alone(world):
    """Borrowers may use what lenders leave idle (Kueue #4813): the rule holds a job back only when
    some waiting job could preempt it; with nothing else waiting, quota alone decides."""
    cluster, queues, pending, run, holding = world
    alone = [p for p in pending if p.job.id not in holding][:1]
    if not alone:
        return
    r = decision_round(1000.0, cluster, queues, alone, run)
    assert r.reserved == _old_reservations(cluster, queues, alone, run, set())


def test_the_services_are_three_steps_of_one_policy():
    from corral.core.reservation import placement_config
    from corral.core.steps import Step, step_config

    assert placement_config(PREEMPTION) == step_config(Step.PLACEMENT, PREEMPTION) == PLACEMENT
    assert step_config(Step.QUOTA, PREEMPTION) == step_config(Step.PREEMPTION, PREEMPTION) == PREEMPTION
    try:
        from corral.services.placement.service import Placement as PlacementService
        from corral.services.preemption.service import Preemption
        from corral.services.quota.service import Quota
    except ImportError:  # pragma: no cover - services not installed
        return
    assert PlacementService.config == Quota.config == Preemption.config == PREEMPTION


def test_a_job_held_back_gives_its_quota_back_to_the_jobs_it_blocked():
    """Found by the simulator's services pipeline (tests/unit/sim/test_pipeline_agreement.py): under
    LAS, queue q1 (max 8 GPUs) waits with an 8-GPU job first in the order and a 1-GPU job of higher
    priority behind it, on an empty node. The 8-GPU job passed the quota check, the 1-GPU job did
    not (9 > 8), then the 8-GPU job was held back (the 1-GPU job would preempt it at once, in-queue
    priority) while still counting against q1: nobody was reserved, round after round, forever."""
    cluster = Cluster.uniform(1, 8, "H100")
    queues = (QueueConfig("q0", 4), QueueConfig("q1", 4, max_gpus=8))
    big = PendingJob(job("big", 1, 8, "q1", submit_time=1.0))
    urgent = PendingJob(job("urgent", 1, 1, "q1", priority=100, submit_time=3.0))
    r = run_round(Snapshot(100.0, cluster, queues, (big, urgent), ()), SchedulerConfig.named("las"))
    assert r.reserved == {"urgent"}, r.quota
    assert [d.job_id for d in r.placed] == ["urgent"]
    why = next(d.reason for d in r.quota if isinstance(d, Pending) and d.job_id == "big")
    assert why.code is ReasonCode.RESERVED_FOR and why.detail("reserved_for") == "urgent", why


@SETTINGS
@given(world=worlds())
def test_the_rounds_quota_checks_are_asked_once_per_queue_and_size_with_the_same_answers(world):
    """A round asks `quota_check` once per (queue, GPUs) while the usage stands (`_Checks`): with
    thousands waiting behind a full cohort it asked every job the same question, twice. The
    answers are the check's, before and after usage changes."""
    from corral.core.ordering import tree_for
    from corral.core.quota import QueueUsage, quota_check
    from corral.core.reservation import _Checks

    cluster, queues, pending, run, _ = world
    snap = Snapshot(1000.0, cluster, queues, tuple(pending), tuple(run))
    tree = tree_for(snap, PREEMPTION)
    usage = QueueUsage.of(tree, snap.running)
    check = _Checks(snap, PREEMPTION, tree, usage)
    for p in pending * 2:
        assert check(p.job) == quota_check(snap, p.job, usage, tree=tree)
        if tree.known(p.job.queue):
            usage.add(p.job.queue, p.job.total_gpus)
            check.usage_changed()


@SETTINGS
@given(world=worlds(), look_after=st.integers(1, 3))
def test_a_pass_that_stops_walking_the_order_when_no_job_left_can_get_quota_decides_the_same(world, look_after):
    """A pass stops walking the fair-share order once no job left could get quota on the usage as
    it stands (`_Left`, asked after `_LOOK_AFTER` refusals in a row): with thousands waiting behind
    full cohorts, walking the whole order was a third of quota's round. The decisions, and each
    refusal's reason, are the same as a walk to the end (only the order of refusals may differ)."""
    import corral.core.reservation as reservation

    cluster, queues, pending, run, holding = world
    snap = Snapshot(1000.0, cluster, queues, tuple(pending), tuple(run))
    full = reservation.reserve_quota(snap, PREEMPTION, reserved=holding)
    saved = reservation._LOOK_AFTER
    reservation._LOOK_AFTER = look_after
    try:
        early = reservation.reserve_quota(snap, PREEMPTION, reserved=holding)
    finally:
        reservation._LOOK_AFTER = saved
    assert len(early) == len(full)
    assert {d.job_id: d for d in early} == {d.job_id: d for d in full}
