"""Queue tree quotas, reclaim, fair-share order and EASY backfill."""

from __future__ import annotations

import pytest

from corral.core import (
    Cluster,
    GpuRequest,
    Pending,
    PendingJob,
    Place,
    Preempt,
    QueueConfig,
    ReasonCode,
    SchedulerConfig,
    Snapshot,
    Topology,
    TopologyLevel,
    order_pending,
    quota_check,
    schedule,
    select_victims,
    static_feasibility,
)
from corral.core.reservation import Reserve, reserve_quota

from .builders import job, running, snapshot


def test_unknown_queue_is_a_reason_not_an_exception():
    [d] = schedule(snapshot(Cluster.uniform(1, 8, "H100"), [job("j", queue="nope")]))
    assert isinstance(d, Pending)
    assert d.reason.code is ReasonCode.QUEUE_UNKNOWN
    assert "nope" in d.reason.message


def test_max_gpus_is_never_exceeded_even_with_free_gpus():
    cluster = Cluster.uniform(2, 8, "H100")
    queues = [QueueConfig("q", guaranteed_gpus=0, max_gpus=8)]
    run = [running(job("r", gpus=6), [("n000", tuple(range(6)))])]
    [d] = schedule(snapshot(cluster, [job("j", gpus=4)], run, queues))
    assert isinstance(d, Pending)
    assert d.reason.code is ReasonCode.MAX_GPUS_EXCEEDED
    assert d.reason.message == "queue q uses 6 of max 8 GPUs; job needs 4 more"


def test_max_gpus_of_a_parent_queue_binds_its_children():
    cluster = Cluster.uniform(2, 8, "H100")
    queues = [QueueConfig("research", max_gpus=8), QueueConfig("research/nlp"), QueueConfig("research/cv")]
    run = [running(job("r", gpus=8, queue="research/cv"), [("n000", tuple(range(8)))])]
    [d] = schedule(snapshot(cluster, [job("j", queue="research/nlp")], run, queues))
    assert isinstance(d, Pending) and d.reason.code is ReasonCode.MAX_GPUS_EXCEEDED
    assert "queue research uses 8 of max 8" in d.reason.message


def test_lend_limit_caps_what_siblings_may_borrow_and_the_reason_has_numbers():
    cluster = Cluster.uniform(4, 8, "H100")
    queues = [
        QueueConfig("research", guaranteed_gpus=32),
        QueueConfig("research/nlp", guaranteed_gpus=24, lend_limit=0),
        QueueConfig("research/cv", guaranteed_gpus=8),
    ]
    run = [running(job("r", gpus=8, queue="research/cv"), [("n000", tuple(range(8)))])]
    snap = snapshot(cluster, [job("j", gpus=4, queue="research/cv")], run, queues)
    reason = quota_check(snap, snap.pending[0].job)
    assert reason is not None and reason.code is ReasonCode.QUOTA_EXCEEDED
    assert reason.message == "queue research/cv uses 8 of 8 guaranteed GPUs, job needs 4 more, cohort lends 0"


def test_borrowed_guarantee_is_reclaimed_for_its_owner():
    cluster = Cluster.uniform(2, 8, "H100")
    queues = [QueueConfig("a", guaranteed_gpus=8), QueueConfig("b", guaranteed_gpus=8)]
    run = [
        running(job("b1", gpus=8, queue="b"), [("n000", tuple(range(8)))], start=0.0),
        running(job("b2", gpus=8, queue="b"), [("n001", tuple(range(8)))], start=900.0),
    ]
    [d] = schedule(snapshot(cluster, [job("a1", gpus=8, queue="a")], run, queues))
    assert isinstance(d, Preempt)
    assert d.reason.code is ReasonCode.RECLAIMED_FOR_GUARANTEE
    assert d.victims == ("b2",)  # the one that loses the least work


def test_reclaim_never_takes_a_queue_below_its_guarantee():
    cluster = Cluster.uniform(2, 8, "H100")
    queues = [QueueConfig("a", guaranteed_gpus=8), QueueConfig("b", guaranteed_gpus=8)]
    run = [running(job("b1", gpus=8, queue="b"), [("n000", tuple(range(8)))])]
    # b is within its guarantee: a (also within) cannot take b's GPUs; n001 is free anyway
    [d] = schedule(snapshot(cluster, [job("a1", gpus=8, queue="a")], run, queues))
    assert isinstance(d, Place)


def test_borrower_over_guarantee_cannot_preempt_across_queues():
    cluster = Cluster.uniform(1, 8, "H100")
    queues = [QueueConfig("a", guaranteed_gpus=4), QueueConfig("b", guaranteed_gpus=4)]
    run = [running(job("a1", gpus=8, queue="a"), [("n000", tuple(range(8)))])]
    snap = snapshot(cluster, [job("b1", gpus=8, queue="b", priority=1000)], run, queues)
    [d] = schedule(snap)
    assert isinstance(d, Pending)  # b asks beyond its guarantee: no reclaim, priority is per queue
    assert isinstance(select_victims(snap, snap.pending[0]), type(d.reason))


def test_fair_share_orders_the_queue_furthest_below_its_entitlement_first():
    cluster = Cluster.uniform(4, 8, "H100")
    queues = [QueueConfig("a", guaranteed_gpus=16), QueueConfig("b", guaranteed_gpus=16)]
    run = [running(job("ra", gpus=8, queue="a"), [("n000", tuple(range(8)))])]
    pending = [job(f"a{i}", queue="a", submit_time=i) for i in range(3)] + [
        job(f"b{i}", queue="b", submit_time=10 + i) for i in range(3)
    ]
    order = [p.job.id for p in order_pending(snapshot(cluster, pending, run, queues), SchedulerConfig())]
    assert order[:3] == ["b0", "b1", "b2"]


def test_surplus_is_shared_by_weight():
    cluster = Cluster.uniform(4, 8, "H100")
    queues = [QueueConfig("heavy", weight=3.0), QueueConfig("light", weight=1.0)]
    pending = [job(f"h{i}", queue="heavy", gpus=1, submit_time=i) for i in range(40)] + [
        job(f"l{i}", queue="light", gpus=1, submit_time=i) for i in range(40)
    ]
    decisions = schedule(snapshot(cluster, pending, [], queues))
    placed = [d.job_id for d in decisions if isinstance(d, Place)]
    assert len(placed) == 32
    assert sum(p.startswith("h") for p in placed) == 24


def test_head_of_line_gang_gets_a_reservation_and_small_jobs_cannot_delay_it():
    cluster = Cluster.uniform(2, 8, "H100")
    run = [running(job("r", gpus=8, estimated_runtime_seconds=1000.0), [("n000", tuple(range(8)))], start=900.0)]
    head = job("head", replicas=2, gpus=8, submit_time=1.0)
    long_small = job("long", gpus=4, submit_time=2.0)  # no estimate: may not touch reserved GPUs
    quick = job("quick", gpus=4, submit_time=3.0, estimated_runtime_seconds=100.0)  # ends before 1900
    snap = snapshot(cluster, [head, long_small, quick], run, now=1000.0)
    d_head, d_long, d_quick = schedule(snap, SchedulerConfig.named("backfill"))
    assert isinstance(d_head, Pending) and d_head.reason.code is ReasonCode.GANG_DOES_NOT_FIT
    assert "reservation of 16 GPUs" in d_head.reason.message
    assert isinstance(d_long, Pending) and d_long.reason.code is ReasonCode.RESERVED_FOR
    assert "job head holds a reservation" in d_long.reason.message
    assert isinstance(d_quick, Place) and d_quick.reason.code is ReasonCode.BACKFILLED


def test_backfill_uses_gpus_the_reservation_does_not_need():
    cluster = Cluster.uniform(3, 8, "H100")
    run = [running(job("r", gpus=8), [("n000", tuple(range(8)))])]
    run.append(running(job("r2", gpus=4), [("n001", (0, 1, 2, 3))]))
    head = job("head", replicas=2, gpus=8, submit_time=1.0, topology=Topology(gang=TopologyLevel.NODE))
    snap = snapshot(cluster, [head, job("small", gpus=2, submit_time=2.0)], run)
    d_head, d_small = schedule(snap, SchedulerConfig.named("backfill"))
    assert isinstance(d_head, Pending) and d_head.reason.code is ReasonCode.TOPOLOGY_UNSATISFIABLE
    assert isinstance(d_small, Place)


def test_static_feasibility_rejects_what_never_fits():
    cluster = Cluster.uniform(4, 8, "H100", nvlink_domain_size=4)
    assert static_feasibility(cluster, job("ok", replicas=4, gpus=8)) is None
    too_wide = static_feasibility(cluster, job("w", gpus=16))
    assert too_wide is not None and too_wide.code is ReasonCode.TOPOLOGY_UNSATISFIABLE
    assert "largest node has 8" in too_wide.message
    nv = static_feasibility(cluster, job("nv", gpus=8, topology=Topology(replica=TopologyLevel.NVLINK)))
    assert nv is not None and "largest NVLink domain has 4" in nv.message
    model = static_feasibility(cluster, job("m", gpu=GpuRequest("B200")))
    assert model is not None and model.code is ReasonCode.NO_MATCHING_GPU


def test_rack_gang_reason_names_the_best_rack():
    cluster = Cluster.uniform(8, 8, "H100", nodes_per_rack=4)
    run = [running(job(f"r{i}", gpus=8), [(f"n00{i}", tuple(range(8)))]) for i in (0, 4)]
    snap = snapshot(cluster, [job("g", replicas=4, gpus=8, topology=Topology(gang=TopologyLevel.RACK))], run)
    [d] = schedule(snap)
    assert isinstance(d, Pending) and d.reason.code is ReasonCode.GANG_DOES_NOT_FIT
    assert d.reason.message.startswith(
        "needs 4x8 GPUs inside one rack; best rack has 24 free GPUs, room for 3 of 4 ranks"
    )


def test_waiting_job_holds_gpus_being_released_by_its_victims():
    cluster = Cluster.uniform(1, 8, "H100")
    run = [running(job("victim", gpus=8), [("n000", tuple(range(8)))], preempting=True)]
    pend = [PendingJob(job("hi", gpus=8, priority=10)), PendingJob(job("lo", gpus=1, submit_time=5.0))]
    d1, d2 = schedule(Snapshot(1000.0, cluster, (QueueConfig("q"),), tuple(pend), tuple(run)))
    assert isinstance(d1, Pending) and d1.reason.code is ReasonCode.WAITING_FOR_PREEMPTION
    assert isinstance(d2, Pending) and d2.reason.code is not ReasonCode.WAITING_FOR_PREEMPTION


@pytest.mark.parametrize("policy", ["corral", "fifo", "priority", "backfill", "las"])
def test_every_named_policy_decides_once_per_pending_job(policy):
    cluster = Cluster.uniform(2, 8, "H100")
    pending = [job(f"j{i}", gpus=1 + i % 8, submit_time=i, priority=i % 3) for i in range(12)]
    decisions = schedule(snapshot(cluster, pending), SchedulerConfig.named(policy))
    assert sorted(d.job_id for d in decisions) == sorted(j.id for j in pending)


def test_las_lets_a_fresh_job_preempt_one_with_far_more_attained_service():
    cluster = Cluster.uniform(1, 8, "H100")
    run = [running(job("hog", gpus=8), [("n000", tuple(range(8)))], start=0.0)]
    snap = snapshot(cluster, [PendingJob(job("fresh", gpus=8))], run, now=100_000.0)
    [d] = schedule(snap, SchedulerConfig.named("las"))
    assert isinstance(d, Preempt) and d.reason.code is ReasonCode.PREEMPTED_FOR_LAS
    # and the job it preempted may not preempt it back (no ping-pong)
    back = PendingJob(job("hog", gpus=8), attained_gpu_seconds=0.0, preempted_by=frozenset({"fresh"}))
    run2 = [running(job("fresh", gpus=8), [("n000", tuple(range(8)))], start=0.0)]
    [d2] = schedule(snapshot(cluster, [back], run2, now=100_000.0), SchedulerConfig.named("las"))
    assert isinstance(d2, Pending)


def test_backfilled_jobs_do_not_delay_the_reserved_gang():
    cluster = Cluster.uniform(2, 8, "H100")
    r = running(job("r", gpus=8, estimated_runtime_seconds=100.0), [("n000", tuple(range(8)))], start=950.0)
    head = job("head", replicas=2, gpus=8, submit_time=1.0)
    fillers = [job(f"f{i}", gpus=2, submit_time=2.0 + i, estimated_runtime_seconds=40.0) for i in range(6)]
    decisions = schedule(snapshot(cluster, [head, *fillers], [r], now=1000.0), SchedulerConfig.named("backfill"))
    placed = [d for d in decisions if isinstance(d, Place)]
    assert placed and all(d.reason.code is ReasonCode.BACKFILLED for d in placed)
    # at the shadow time (t=1050) the running job and every backfilled job (ends by 1040) are gone
    [d] = schedule(snapshot(cluster, [head], [], now=1050.0), SchedulerConfig.named("backfill"))
    assert isinstance(d, Place)
    # a filler whose estimate runs past the shadow time may not use the reserved GPUs
    late = job("late", gpus=2, submit_time=9.0, estimated_runtime_seconds=500.0)
    ds = schedule(snapshot(cluster, [head, late], [r], now=1000.0), SchedulerConfig.named("backfill"))
    assert isinstance(ds[1], Pending) and ds[1].reason.code is ReasonCode.RESERVED_FOR


def test_a_quota_reason_counts_every_reservation_of_its_round():
    """Quota decides in fair-share order: the 2x4 gang's turn came first (4 of max 8 in use), then
    the later 1x4 job was reserved the other 4. The gang's reason said "uses 4 of max 8" while the
    queue used 8 (seen live: `corral why` printed it above "queue q uses 8 of 8 guaranteed GPUs")."""
    cluster = Cluster.uniform(2, 4, "H100")
    queues = [QueueConfig("q", guaranteed_gpus=8, max_gpus=8)]
    run = [running(job("a", gpus=4), [("n000", (0, 1, 2, 3))])]
    snap = snapshot(cluster, [job("g", 2, 4, submit_time=1.0), job("h", 1, 4, submit_time=2.0)], run, queues)
    decisions = {d.job_id: d for d in reserve_quota(snap)}
    assert isinstance(decisions["h"], Reserve)
    gang = decisions["g"]
    assert isinstance(gang, Pending) and gang.reason.code is ReasonCode.MAX_GPUS_EXCEEDED
    assert gang.reason.message == "queue q uses 8 of max 8 GPUs; job needs 8 more", gang.reason
