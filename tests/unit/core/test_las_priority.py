"""Under `las`, priority and least attained service agree within a queue: no ping-pong.

Priority preemption acts within a queue (a strictly higher priority preempts); LAS preempts a job
that attained far more service. Were LAS allowed to take a job of a higher priority of its own
queue, the taken job, waiting, would preempt its taker back for its priority, and so on: two jobs
of one queue on a cluster too small for both would swap for ever (each swap a checkpoint and a
restart), held back only by the per-pair history (`RunningJob.preempted_by`), which a third job
of the queue breaks. So LAS never preempts a job of a higher priority of the preemptor's queue.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from corral.core import Cluster, PendingJob, Preempt, QueueConfig, ReasonCode, SchedulerConfig, Snapshot, schedule

from .builders import job, running, snapshot
from .test_core_properties import SETTINGS

LAS = SchedulerConfig.named("las")
ONE_NODE = Cluster.uniform(1, 8, "H100")
QUEUES = [QueueConfig("q", 8), QueueConfig("r", 8)]
NOW = 10_000.0


def _swap(waiting: str, priority_w: int, attained_w: float, runs: str, priority_r: int, attained_r: float,
          queue_r: str = "q") -> Snapshot:
    """`runs` holds the one node (8 GPUs, checkpointed just now, `attained_r` GPU-seconds from
    earlier runs); `waiting`, of queue q, asks the whole node too: the cluster is too small for both."""
    w = PendingJob(job(waiting, gpus=8, priority=priority_w, submit_time=0.0), attained_w)
    r = running(job(runs, gpus=8, priority=priority_r, queue=queue_r, submit_time=0.0), [("n000", tuple(range(8)))],
                start=NOW, checkpoint=NOW, attained_gpu_seconds=attained_r)
    return snapshot(ONE_NODE, [w], [r], QUEUES, now=NOW)


def _preempts(s: Snapshot) -> list[tuple[str, tuple[str, ...], ReasonCode]]:
    return [(d.job_id, d.victims, d.reason.code) for d in schedule(s, LAS) if isinstance(d, Preempt)]


def test_a_new_low_priority_job_does_not_take_a_high_priority_job_it_would_lose_to() -> None:
    """`hi` (priority 100) has run 8,000 GPU-seconds; `lo` (priority 0, no service) arrives in
    its queue. LAS would take `hi` for `lo`, and `hi`, waiting, would take `lo` back for its
    priority: only the second holds."""
    assert _preempts(_swap("lo", 0, 0.0, "hi", 100, 8000.0)) == []
    assert _preempts(_swap("hi", 100, 8000.0, "lo", 0, 0.0)) == [("hi", ("lo",), ReasonCode.PREEMPTED_FOR_PRIORITY)]


def test_las_still_takes_a_higher_priority_job_of_another_queue() -> None:
    """Priorities rank jobs within a queue only: across queues LAS goes by service alone."""
    assert _preempts(_swap("lo", 0, 0.0, "hi", 100, 8000.0, queue_r="r")) == [
        ("lo", ("hi",), ReasonCode.PREEMPTED_FOR_LAS)]


@SETTINGS
@given(priorities=st.tuples(st.sampled_from([0, 0, 50, 100]), st.sampled_from([0, 0, 50, 100])),
       attained=st.tuples(st.sampled_from([0.0, 100.0, 3000.0, 8000.0, 50_000.0]),
                          st.sampled_from([0.0, 100.0, 3000.0, 8000.0, 50_000.0])))
def test_two_jobs_of_one_queue_never_preempt_each_other_both_ways(
    priorities: tuple[int, int], attained: tuple[float, float]
) -> None:
    """For two jobs of one queue and no history between them, at most one of the two swaps is a
    preemption: whichever runs, the other's decision is never undone by the first's."""
    (pa, pb), (sa, sb) = priorities, attained
    a_takes_b = _preempts(_swap("a", pa, sa, "b", pb, sb))
    b_takes_a = _preempts(_swap("b", pb, sb, "a", pa, sa))
    assert not (a_takes_b and b_takes_a), (a_takes_b, b_takes_a)
    for decisions, mine, theirs in ((a_takes_b, pa, pb), (b_takes_a, pb, pa)):
        if decisions:
            assert theirs <= mine, "LAS never takes a higher priority of the queue"
