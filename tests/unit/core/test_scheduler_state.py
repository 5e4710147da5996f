"""A SchedulerState kept in step with the jobs decides exactly what `schedule(snapshot)` decides.

Why: the simulator runs its cycles on a `SchedulerState` (free-GPU index, usage, order and job
classes kept between cycles) instead of rebuilding them from a snapshot every cycle. These
properties drive a state and a plain pair of dicts through the same random history -- arrivals,
placements, preemptions (victims leave after a grace), completions, periodic checkpoints, nodes
lost, drained and back -- and compare, on every cycle and for every policy, the state's snapshot
and both of its answers (explained and actions only) with the from-scratch cycle's, and that
its kept tables hold only live classes and promotions (test_state_tables.py).
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.core import (
    Cluster,
    NodeState,
    PendingJob,
    Place,
    Preempt,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    schedule,
)
from corral.core.levels import started_promotion
from corral.core.prepared import Prepared, prepare
from corral.core.shortcuts import ClassMemo
from corral.core.state import SchedulerState

from .test_core_properties import POLICIES, SETTINGS, clusters, named, queue_trees, random_job
from .test_state_tables import kept_within_live


class _Twin:
    """The same jobs twice: plain dicts (for `schedule`) and a SchedulerState."""

    def __init__(self, cluster: Cluster, queues, config: SchedulerConfig) -> None:
        self.cluster = cluster
        self.queues = queues
        self.config = config
        self.pending: dict[str, PendingJob] = {}
        self.running: dict[str, RunningJob] = {}
        self.state = SchedulerState(cluster, queues, config)

    def add_pending(self, p: PendingJob) -> None:
        self.pending[p.job.id] = p
        self.state.add_pending(p)

    def pop_pending(self, job_id: str) -> PendingJob:
        self.state.remove_pending(job_id)
        return self.pending.pop(job_id)

    def add_running(self, r: RunningJob) -> None:
        self.running[r.job.id] = r
        self.state.add_running(r)

    def pop_running(self, job_id: str) -> RunningJob:
        self.state.remove_running(job_id)
        return self.running.pop(job_id)

    def replace_running(self, r: RunningJob) -> None:
        self.running[r.job.id] = r
        self.state.replace_running(r)

    def set_node(self, name: str, state: NodeState) -> None:
        self.cluster = Cluster(
            tuple(dataclasses.replace(n, state=state) if n.name == name else n for n in self.cluster.nodes)
        )
        self.state.set_cluster(self.cluster)

    def toggle_gpu(self, name: str, gpu: int) -> None:
        """GPU `gpu` of node `name` goes out of service (unhealthy, drained), or back in."""
        self.cluster = Cluster(tuple(
            dataclasses.replace(n, out_of_service=n.out_of_service ^ {gpu}) if n.name == name else n
            for n in self.cluster.nodes))
        self.state.set_cluster(self.cluster)

    def compare(self, now: float) -> list[object]:
        snap = Snapshot(now, self.cluster, self.queues, tuple(self.pending.values()), tuple(self.running.values()))
        assert self.state.snapshot(now) == snap
        _same_classes(self.state.prepared(now), prepare(snap, self.config, ClassMemo()))
        explained = schedule(snap, self.config)
        assert self.state.cycle(now, explain=True) == explained
        actions = self.state.cycle(now)
        assert actions == schedule(snap, self.config, explain=False)
        assert actions == [d for d in explained if isinstance(d, Place | Preempt)]
        kept_within_live(self.state)
        return actions


def _same_classes(kept: Prepared, fresh: Prepared) -> None:
    """The kept classes are the from-scratch ones: the same spared sets, the same partition of the
    waiting jobs, and the classes in the order of their first job with their first job and count."""
    assert dict(kept.spared) == fresh.spared
    ids = [p.job.id for p in fresh.snapshot.pending]
    assert all((kept.classes[a] == kept.classes[b]) == (fresh.classes[a] == fresh.classes[b]) for a in ids for b in ids)
    firsts: dict[int, list[str]] = {}
    for i in ids:
        firsts.setdefault(kept.classes[i], []).append(i)
    assert kept.live is not None and kept.sample is not None
    assert list(kept.live.items()) == [(k, len(m)) for k, m in firsts.items()]
    assert [p.job.id for p in kept.sample.values()] == [m[0] for m in firsts.values()]


def _requeued(r: RunningJob, now: float) -> PendingJob:
    """A job that gave its GPUs back at `now`, with its last run (the starvation limit reads it)."""
    return PendingJob(r.job, r.attained(now), r.preempted_by, r.preempted_at, now, now - r.start_time)


def _history(twin: _Twin, seed: int, cycles: int) -> None:
    rng = random.Random(seed)
    names = [q.name for q in twin.queues] + ["ghost"]
    n = 0
    for c in range(cycles):
        now = 10.0 * c
        for r in list(twin.running.values()):
            end = r.expected_end()
            if r.preempting and rng.random() < 0.7:  # the grace is over: requeued
                twin.pop_running(r.job.id)
                twin.add_pending(_requeued(r, now))
            elif end is not None and end <= now:
                twin.pop_running(r.job.id)
            elif rng.random() < 0.2:  # a periodic checkpoint
                twin.replace_running(dataclasses.replace(r, last_checkpoint_time=now))
        event = rng.random()
        if event < 0.1:  # a node is lost: its jobs go back to the queue
            node = rng.choice(twin.cluster.nodes).name
            twin.set_node(node, NodeState.LOST)
            for r in list(twin.running.values()):
                if node in r.placement.nodes():
                    twin.pop_running(r.job.id)
                    twin.add_pending(_requeued(r, now))
        elif event < 0.2:
            twin.set_node(rng.choice(twin.cluster.nodes).name, NodeState.DRAINING)
        elif event < 0.35:
            twin.set_node(rng.choice(twin.cluster.nodes).name, NodeState.READY)
        elif event < 0.5:  # a GPU goes out of service (perhaps under a running job), or comes back
            node = rng.choice(twin.cluster.nodes)
            twin.toggle_gpu(node.name, rng.choice(node.gpus).index)
        for _ in range(rng.randint(0, 4)):
            j = random_job(rng, n, now, names, False)
            twin.add_pending(PendingJob(j))
            n += 1
        if rng.random() < 0.2 and twin.pending:  # a job is cancelled while it waits
            twin.pop_pending(rng.choice(sorted(twin.pending)))
        for d in twin.compare(now):
            if isinstance(d, Place):
                p = twin.pop_pending(d.job_id)
                started = RunningJob(p.job, d.placement, now, None, False, p.attained_gpu_seconds, p.preempted_by,
                                     promoted_service=started_promotion(p, twin.config, now))
                twin.add_running(started)
            elif isinstance(d, Preempt):
                for v in d.victims:
                    r = twin.running[v]
                    twin.replace_running(
                        dataclasses.replace(r, preempting=True, preempted_by=r.preempted_by | {d.job_id})
                    )


@SETTINGS
@given(data=st.data(), policy=st.sampled_from(POLICIES), seed=st.integers(0, 2**16))
def test_scheduler_state_decides_what_the_snapshot_cycle_decides(data, policy, seed):
    cluster = data.draw(clusters())
    queues = data.draw(queue_trees(max(cluster.usable_gpus, 1)))
    _history(_Twin(cluster, queues, named(policy)), seed, cycles=14)


def test_scheduler_state_refuses_a_job_id_twice():
    state = SchedulerState(Cluster.uniform(1, 8, "H100"), (), SchedulerConfig())
    rng = random.Random(0)
    job = random_job(rng, 0, 0.0, ["a"], True)
    state.add_pending(PendingJob(job))
    with pytest.raises(ValueError, match="already pending or running"):
        state.add_pending(PendingJob(job))
