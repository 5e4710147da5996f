"""Service levels (`core.levels`) and the fair-las policy against their plain definitions: a level
counts the thresholds reached; inside a queue the order is (priority, level, submit time, id);
across queues it is fair share's; a same-queue victim is at a strictly higher level."""

from __future__ import annotations

import dataclasses
from unittest.mock import patch

from hypothesis import given
from hypothesis import strategies as st

from corral.core import Cluster, PendingJob, Preempt, QueueConfig, RunningJob, SchedulerConfig, schedule, starvation
from corral.core.levels import in_queue_key, level
from corral.core.model import OrderPolicy
from corral.core.ordering import order_pending
from corral.core.state import SchedulerState

from .builders import job, running, snapshot
from .test_core_properties import SETTINGS as _SETTINGS

SETTINGS = _SETTINGS.__class__(_SETTINGS, max_examples=60)  # each example is a few ms: the suite stays fast

THRESHOLDS = st.lists(st.floats(0, 1e6, allow_nan=False), max_size=4).map(lambda xs: tuple(sorted(xs)))


@given(attained=st.floats(0, 2e6, allow_nan=False), thresholds=THRESHOLDS)
def test_a_level_counts_the_thresholds_reached(attained: float, thresholds: tuple[float, ...]) -> None:
    assert level(attained, thresholds) == sum(1 for t in thresholds if t <= attained)


@st.composite
def waiting(draw: st.DrawFn) -> list[PendingJob]:
    out = []
    for i in range(draw(st.integers(0, 12))):
        j = job(f"j{i}", 1, draw(st.sampled_from([1, 2, 4])), queue=draw(st.sampled_from("abc")),
                priority=draw(st.sampled_from([0, 0, 5])), submit_time=float(draw(st.integers(0, 5))))
        out.append(PendingJob(j, draw(st.sampled_from([0.0, 0.0, 50.0, 500.0, 5000.0]))))
    return out


def _config(thresholds: tuple[float, ...]) -> SchedulerConfig:
    return dataclasses.replace(SchedulerConfig.named("fair-las"), las_thresholds=thresholds)


@SETTINGS
@given(pending=waiting(), thresholds=THRESHOLDS)
def test_each_queue_goes_by_priority_level_submit_time_and_id(pending: list[PendingJob],
                                                              thresholds: tuple[float, ...]) -> None:
    queues = [QueueConfig(q, 2) for q in "abc"]
    ordered = order_pending(snapshot(Cluster.uniform(1, 8, "H100"), pending, queues=queues), _config(thresholds))
    assert sorted(p.job.id for p in ordered) == sorted(p.job.id for p in pending)
    for q in "abc":
        mine = [p for p in ordered if p.job.queue == q]
        plain = sorted(mine, key=lambda p: (-p.job.priority, sum(1 for t in thresholds if t <= p.attained_gpu_seconds),
                                            p.job.submit_time, p.job.id))
        assert mine == plain


@SETTINGS
@given(pending=waiting())
def test_without_thresholds_fair_las_orders_as_fair_share(pending: list[PendingJob]) -> None:
    snap = snapshot(Cluster.uniform(1, 8, "H100"), pending, queues=[QueueConfig(q, 2) for q in "abc"])
    assert order_pending(snap, _config(())) == order_pending(snap, SchedulerConfig())
    assert all(in_queue_key(p, ())[1] == 0 for p in pending)


def test_a_new_job_preempts_its_queues_job_of_a_higher_level_never_one_of_its_own_level() -> None:
    """1x2: queue a runs `long` (1 GPU since t=0, checkpointed at t=900: 950 GPU-s at t=950,
    level 1 of (500,)) and `young` (1 GPU since t=900: level 0). The new job `new` (level 0)
    preempts `long` only."""
    cluster = Cluster.uniform(1, 2, "H100")
    runs = [running(job("long", queue="a"), [("n000", (0,))], start=0.0, checkpoint=900.0),
            running(job("young", queue="a"), [("n000", (1,))], start=900.0)]
    snap = snapshot(cluster, [job("new", queue="a", submit_time=950.0)], runs, queues=[QueueConfig("a", 2)])
    decisions = schedule(snap, _config((500.0,)))
    assert [(d.job_id, d.victims) for d in decisions if isinstance(d, Preempt)] == [("new", ("long",))]
    assert not [d for d in schedule(snap, _config((5000.0,))) if isinstance(d, Preempt)]  # both at level 0


def test_a_level_victim_is_one_checkpointed_lately() -> None:
    """1x1: queue a runs `long` (level 1 of (500,)); its last checkpoint is 700 s old at t=950,
    more than the 600 s window: the new job waits. Checkpointed 100 s ago, it is taken; with the
    window off (0), any time."""
    cluster = Cluster.uniform(1, 1, "H100")
    pending = [job("new", queue="a", submit_time=950.0)]

    def victims(checkpoint: float, window: float) -> list[tuple[str, tuple[str, ...]]]:
        runs = [running(job("long", queue="a"), [("n000", (0,))], start=0.0, checkpoint=checkpoint)]
        config = dataclasses.replace(_config((500.0,)), level_victim_fresh_seconds=window)
        decisions = schedule(snapshot(cluster, pending, runs, queues=[QueueConfig("a", 1)]), config)
        return [(d.job_id, d.victims) for d in decisions if isinstance(d, Preempt)]

    assert victims(250.0, 600.0) == []
    assert victims(850.0, 600.0) == [("new", ("long",))]
    assert victims(250.0, 0.0) == [("new", ("long",))]


def test_fair_las_reclaims_by_whole_jobs_from_a_queue_that_keeps_its_guarantee() -> None:
    """4x8, guarantees a 12, b 12, c 8 (fair share 32): a holds 8 (a node), b 16 + 8 of 1-GPU
    jobs, c 0. a's new 8-GPU gang takes a to 16, past its 12: fair share does not reclaim for it
    (a would exceed its guarantee), fair-las does (a is short of it), from b's 1-GPU jobs on one
    node (b keeps 16 >= 12). With b at 16 (its two nodes of 8) and c's gang on the last node, a
    reclaims nothing: b would fall to 8, c to 0, below their guarantees."""
    cluster = Cluster.uniform(4, 8, "H100")
    queues = [QueueConfig("a", 12), QueueConfig("b", 12), QueueConfig("c", 8)]
    mine = running(job("mine", gpus=8, queue="a"), [("n000", tuple(range(8)))], start=0.0)
    gangs = [running(job(f"g{i}", gpus=8, queue="b"), [(f"n00{i}", tuple(range(8)))], start=0.0) for i in (1, 2)]
    ones = [running(job(f"o{g}", queue="b"), [("n003", (g,))], start=0.0, checkpoint=900.0) for g in range(8)]
    pending = [job("new", gpus=8, queue="a", submit_time=950.0)]

    def reclaimed(config: SchedulerConfig, runs: list[RunningJob]) -> list[tuple[str, ...]]:
        decisions = schedule(snapshot(cluster, pending, runs, queues=queues, now=1000.0), config)
        return [d.victims for d in decisions if isinstance(d, Preempt)]

    assert reclaimed(SchedulerConfig(), [mine, *gangs, *ones]) == []
    assert reclaimed(_config((1e9,)), [mine, *gangs, *ones]) == [tuple(f"o{g}" for g in range(8))]
    theirs = running(job("theirs", gpus=8, queue="c"), [("n003", tuple(range(8)))], start=0.0, checkpoint=900.0)
    assert reclaimed(_config((1e9,)), [mine, *gangs, theirs]) == []


def test_fair_las_never_preempts_another_queues_job_for_service() -> None:
    """Queue b's job runs far longer than a's waiting job, but b is within its guarantee: no victim."""
    cluster = Cluster.uniform(1, 1, "H100")
    runs = [running(job("theirs", queue="b"), [("n000", (0,))], start=0.0)]
    snap = snapshot(cluster, [job("mine", queue="a", submit_time=950.0)], runs,
                    queues=[QueueConfig("a", 0), QueueConfig("b", 1)])
    assert SchedulerConfig.named("fair-las").order is OrderPolicy.FAIR_LAS
    assert not [d for d in schedule(snap, _config((1.0,))) if isinstance(d, Preempt)]


def test_a_level_preemption_takes_no_victim_larger_than_the_preemptor() -> None:
    """1x8: queue a runs `gang` (4 GPUs since t=0, level 1 of (500,)) and `one` (1 GPU since t=0,
    level 1), 3 GPUs free. A new 4-GPU job fits only once `one` is gone: it preempts `one` (no
    larger than it), never `gang`. With the node full (`rest`, 3 GPUs, level 0), a new 2-GPU job
    preempts nobody: `one` frees 1 GPU of its 2, and `gang` (4 GPUs) is larger than it."""
    cluster = Cluster.uniform(1, 8, "H100")
    runs = [running(job("gang", gpus=4, queue="a"), [("n000", (0, 1, 2, 3))], start=0.0, checkpoint=900.0),
            running(job("one", queue="a"), [("n000", (4,))], start=0.0, checkpoint=900.0)]
    queues = [QueueConfig("a", 8)]
    snap = snapshot(cluster, [job("new", gpus=4, queue="a", submit_time=950.0)], runs, queues=queues)
    assert [(d.job_id, d.victims) for d in schedule(snap, _config((500.0,))) if isinstance(d, Preempt)] == [
        ("new", ("one",))]
    full = [*runs, running(job("rest", gpus=3, queue="a"), [("n000", (5, 6, 7))], start=900.0)]
    snap = snapshot(cluster, [job("pair", gpus=2, queue="a", submit_time=950.0)], full, queues=queues)
    assert not [d for d in schedule(snap, _config((500.0,))) if isinstance(d, Preempt)]  # `one` frees 1 of 2


def test_a_class_reads_attained_service_as_much_as_its_policy_does() -> None:
    """Jobs that differ only in attained service are one class under fair share (nothing reads
    it), one class per level under fair-las, and apart under LAS (the exact value ranks them)."""
    from corral.core.prepared import prepare
    from corral.core.shortcuts import ClassMemo

    waiting = [PendingJob(job("a"), 0.0), PendingJob(job("b"), 100.0), PendingJob(job("c"), 900.0)]
    snap = snapshot(Cluster.uniform(1, 1, "H100"), waiting, queues=[QueueConfig("q", 1)])

    def partition(config: SchedulerConfig) -> list[int]:
        classes = prepare(snap, config, ClassMemo()).classes
        return [classes[i] - classes["a"] for i in "abc"]

    assert partition(SchedulerConfig()) == [0, 0, 0]
    assert partition(_config((500.0,))) == [0, 0, partition(_config((500.0,)))[2]] != [0, 0, 0]
    assert len(set(partition(SchedulerConfig.named("las")))) == 3


@st.composite
def requeued(draw: st.DrawFn) -> list[PendingJob]:
    """Waiting jobs, some back from a run: requeued at 0-100 s after a run of 0-40 s."""
    out = []
    for p in draw(waiting()):
        if draw(st.booleans()):
            p = dataclasses.replace(p, requeued_at=float(draw(st.integers(0, 100))),
                                    last_run_seconds=float(draw(st.integers(0, 40))))
        out.append(p)
    return out


LIMITS = st.sampled_from([0.0, 0.5, 1.0, 3.0])
TIMES = st.integers(0, 300).map(float)


def _plain_key(p: PendingJob, thresholds: tuple[float, ...], limit: float, now: float,
               arrives: bool = False) -> tuple[object, ...]:
    ran = p.requeued_at is not None and p.last_run_seconds > 0
    promoted = limit > 0 and ran and now - p.requeued_at >= limit * p.last_run_seconds  # type: ignore[operator]
    lv = sum(1 for t in thresholds if t <= p.attained_gpu_seconds)
    own = (-p.job.priority, -1 if promoted and not arrives else lv, p.job.submit_time, p.job.id)
    if promoted and arrives:  # at level 0 as if submitted when promoted, unless its own key is ahead
        return min(own, (-p.job.priority, 0, p.requeued_at + limit * p.last_run_seconds, p.job.id))  # type: ignore[operator]
    return own


@SETTINGS
@given(pending=requeued(), thresholds=THRESHOLDS, limit=LIMITS, now=TIMES, arrives=st.booleans())
def test_a_job_waiting_its_starvation_limit_leads_its_queue(pending: list[PendingJob], thresholds: tuple[float, ...],
                                                            limit: float, now: float, arrives: bool) -> None:
    """Inside a queue: priority, then the jobs promoted at `now` (waited `limit` x their last run
    since requeued), then level, submit time and id; with `promotion_arrives` a promoted job is at
    level 0 with its promotion time for its submit time."""
    config = dataclasses.replace(_config(thresholds), starvation_limit=limit, promotion_arrives=arrives)
    queues = [QueueConfig(q, 2) for q in "abc"]
    snap = dataclasses.replace(snapshot(Cluster.uniform(1, 8, "H100"), pending, queues=queues), now=now)
    ordered = order_pending(snap, config)
    for q in "abc":
        mine = [p for p in ordered if p.job.queue == q]
        assert mine == sorted(mine, key=lambda p: _plain_key(p, thresholds, limit, now, arrives))


@SETTINGS
@given(data=st.data(), thresholds=THRESHOLDS, limit=LIMITS)
def test_the_kept_order_with_promotion_is_the_order_from_scratch(data: st.DataObject, thresholds: tuple[float, ...],
                                                                  limit: float) -> None:
    """A `SchedulerState` re-keys promoted jobs as the time moves (forwards or back) and as jobs
    come and go: its walk is `order_pending` of the same snapshot at every step. With no slack the
    promotion heap is rebuilt at almost every job that leaves (`starvation.Promotions.remove`)."""
    config = dataclasses.replace(_config(thresholds), starvation_limit=limit,
                                 promotion_arrives=data.draw(st.booleans()))
    queues = [QueueConfig(q, 2) for q in "abc"]
    cluster = Cluster.uniform(1, 8, "H100")
    with patch.object(starvation, "_SLACK", data.draw(st.sampled_from([0, 64]))):
        _kept_order_as_jobs_come_and_go(data, config, cluster, queues)


def _kept_order_as_jobs_come_and_go(data: st.DataObject, config: SchedulerConfig, cluster: Cluster,
                                    queues: list[QueueConfig]) -> None:
    state = SchedulerState(cluster, queues, config)
    pool = data.draw(requeued())
    waiting_now: dict[str, PendingJob] = {}
    for _ in range(data.draw(st.integers(1, 8))):
        for p in pool:
            if p.job.id not in waiting_now and data.draw(st.booleans()):
                state.add_pending(p)
                waiting_now[p.job.id] = p
        if waiting_now and data.draw(st.booleans()):
            gone = data.draw(st.sampled_from(sorted(waiting_now)))
            state.remove_pending(gone)
            del waiting_now[gone]
        now = data.draw(TIMES)
        kept = state.prepared(now)
        snap = dataclasses.replace(snapshot(cluster, list(waiting_now.values()), queues=queues), now=now)
        assert [p.job.id for p in kept.order(kept.usage)] == [p.job.id for p in order_pending(snap, config)]
