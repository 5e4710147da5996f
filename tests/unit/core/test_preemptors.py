"""`Preemptors.may_preempt` is a necessary condition for a Preempt: whenever it answers False,
the full cycle over the same waiting and running jobs decides no Preempt, under every policy.

Random histories drive the cycle (`test_core_properties.simulate`); the index is kept across
cycles as jobs come and go (put / discard) and must equal one built afresh from each snapshot.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from corral.core import (
    Cluster,
    Gpu,
    Job,
    Node,
    PendingJob,
    Placement,
    Preempt,
    QueueConfig,
    RankPlacement,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    schedule,
)
from corral.core.preemption import Preemptors
from corral.core.steps import preemption_step
from tests.unit.core.test_core_properties import POLICIES, SETTINGS, clusters, named, queue_trees, simulate


@SETTINGS
@given(data=st.data(), policy=st.sampled_from(POLICIES), seed=st.integers(0, 2**16), simple=st.booleans())
def test_no_preempt_when_no_waiting_job_could_preempt(data, policy, seed, simple):
    cluster = data.draw(clusters())
    capacity = sum(len(n.gpus) for n in cluster.nodes)
    queues = data.draw(queue_trees(capacity))
    config = named(policy)
    kept = Preemptors()
    seen = {"quiet": 0, "acted": 0}

    def check(snap: Snapshot, config: SchedulerConfig, decisions) -> None:
        for job_id in set(kept.waiting()) - {p.job.id for p in snap.pending}:
            kept.discard(job_id)
        for p in snap.pending:
            kept.put(p)
        assert kept.waiting() == Preemptors(snap.pending).waiting()
        if not kept.may_preempt(snap.running, snap.now, config):
            seen["quiet"] += 1
            assert not any(isinstance(d, Preempt) for d in decisions), "a Preempt where none could be"
        elif any(isinstance(d, Preempt) for d in decisions):
            seen["acted"] += 1

    simulate(cluster, queues, config, seed, 12, simple, check)


def full_of_one_queue(waiting: int, *, priority: int = 0) -> Snapshot:
    """A 4x8-GPU cluster full of day-long 8-GPU jobs of one queue, `waiting` more of them waiting."""
    nodes = tuple(Node(f"n{i}", tuple(Gpu(g, "H100", 80, 0) for g in range(8)), "r0", "z0") for i in range(4))
    job = Job(id="job", queue="bench", replicas=1, gpus_per_replica=8, submit_time=0.0,
              estimated_runtime_seconds=86400.0)
    running = tuple(RunningJob(dataclasses.replace(job, id=f"r{i}"),
                               Placement((RankPlacement(0, f"n{i}", tuple(range(8))),)), 0.0) for i in range(4))
    pending = tuple(PendingJob(dataclasses.replace(job, id=f"w{i:05d}", submit_time=1.0 + i, priority=priority))
                    for i in range(waiting))
    return Snapshot(100.0, Cluster(nodes), (QueueConfig("bench", 32),), pending, running)


def test_a_backlog_of_its_own_queue_at_its_priority_cannot_preempt():
    """The CLI bench's shape: nothing to search; one waiting job of a higher priority could."""
    config = SchedulerConfig.named("corral")
    snap = full_of_one_queue(200)
    assert not Preemptors(snap.pending).may_preempt(snap.running, snap.now, config)
    assert preemption_step(snap, config) == []
    urgent = full_of_one_queue(1, priority=5).pending[0]
    urgent = dataclasses.replace(urgent, job=dataclasses.replace(urgent.job, id="urgent"))
    index = Preemptors(snap.pending)
    index.put(urgent)
    assert index.may_preempt(snap.running, snap.now, config)
    both = dataclasses.replace(snap, pending=(*snap.pending, urgent))
    assert [d.job_id for d in schedule(both, config, explain=False) if isinstance(d, Preempt)] == ["urgent"]
    index.discard("urgent")
    assert not index.may_preempt(snap.running, snap.now, config)
