"""What a caller's memo keeps of the running jobs (`RunningParts`) is what `prepare` derives from scratch.

Why: the services' round asks placement and preemption several times about one state, and the
simulator's services pipeline asks them again each round with a job or two changed; the memo
finds the running jobs' parts again by the tuple's identity (or the parts grown from them for the
tuple once a few jobs start), or moves them to the new tuple by the jobs that differ. These
properties drive one memo through the random histories of tests/unit/core/test_scheduler_state.py
and compare, on every cycle, the warm parts with the cold ones and the warm cycle's decisions with
the cold cycle's.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.core import Cluster, Job, PendingJob, Placement, RankPlacement, RunningJob, Snapshot, schedule
from corral.core.prepared import Prepared, prepare
from corral.core.running_parts import RunningParts
from corral.core.shortcuts import ClassMemo
from corral.core.steps import Step, step_config

from .test_core_properties import POLICIES, SETTINGS, clusters, named, queue_trees
from .test_scheduler_state import _history, _Twin


def _same(warm: Prepared, cold: Prepared) -> None:
    assert warm.fi.free == cold.fi.free and warm.fi.total_free == cold.fi.total_free
    assert warm.fi.node_buckets == cold.fi.node_buckets and warm.fi.dom_buckets == cold.fi.dom_buckets
    assert warm.releasing == cold.releasing
    assert [r.job.id for r in warm.running] == [r.job.id for r in cold.running]
    assert all(a is b for a, b in zip(warm.running, cold.running, strict=True))
    assert dict(warm.releases) == dict(cold.releases)
    for name in ("held", "active", "users"):
        assert getattr(warm.usage, name) == getattr(cold.usage, name), name
    assert warm.tree.guarantee == cold.tree.guarantee and warm.tree.configs == cold.tree.configs
    assert warm.kept is not None and cold.kept is not None
    for name in type(warm.kept).__slots__:
        assert getattr(warm.kept, name) == getattr(cold.kept, name), name


class _Warm(_Twin):
    """A twin whose every cycle is also decided on a snapshot prepared with one memo kept throughout."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.memo = ClassMemo()

    def compare(self, now: float) -> list[object]:
        actions = super().compare(now)
        snap = Snapshot(now, self.cluster, self.queues, tuple(self.pending.values()), tuple(self.running.values()))
        _same(prepare(snap, self.config, self.memo), prepare(snap, self.config, ClassMemo()))
        _same(prepare(snap, self.config, self.memo), prepare(snap, self.config, ClassMemo()))  # the same tuple
        assert schedule(snap, self.config, memo=self.memo) == schedule(snap, self.config)
        assert schedule(snap, self.config, explain=False, memo=self.memo) == actions
        self._grown(snap)
        return actions

    def _grown(self, snap: Snapshot) -> None:
        """The memo asked about the running jobs less the last few, then about all of them (the
        state once jobs start, `steps.after_placing`): the parts grown from the first are the
        cold ones, and the first stay as they were."""
        running = snap.running
        if not running:
            return
        base = dataclasses.replace(snap, running=running[: len(running) * 2 // 3])
        prepare(base, self.config, self.memo)
        grown = RunningParts.of(base, self.memo).grown(snap.running)
        assert grown is not None and RunningParts.of(snap, self.memo) is grown
        _same(prepare(snap, self.config, self.memo), prepare(snap, self.config, ClassMemo()))
        assert schedule(snap, self.config, memo=self.memo) == schedule(snap, self.config)
        _same(prepare(base, self.config, self.memo), prepare(base, self.config, ClassMemo()))
        placing = step_config(Step.PLACEMENT, self.config)  # the steps' memos share the parts (`StepMemos`)
        _same(prepare(base, placing, self.memo), prepare(base, placing, ClassMemo()))
        assert schedule(base, placing, memo=self.memo) == schedule(base, placing)


@SETTINGS
@given(data=st.data(), policy=st.sampled_from(POLICIES), seed=st.integers(0, 2**16))
def test_kept_running_parts_are_the_ones_derived_from_scratch(data, policy, seed):
    cluster = data.draw(clusters())
    queues = data.draw(queue_trees(max(cluster.usable_gpus, 1)))
    _history(_Warm(cluster, queues, named(policy)), seed, cycles=14)


def _running(job_id: str, gpus: tuple[int, ...]) -> RunningJob:
    job = Job(id=job_id, queue="q", replicas=1, gpus_per_replica=len(gpus), submit_time=0.0)
    return RunningJob(job, Placement((RankPlacement(0, "n000", gpus),)), 0.0)


def test_a_gpu_held_twice_is_refused_and_the_memo_still_answers():
    cluster = Cluster.uniform(1, 8, "H100")
    config = named("corral")
    memo = ClassMemo()
    a, b, c = _running("a", (0, 1)), _running("b", (2, 3)), _running("c", (4,))
    first = Snapshot(0.0, cluster, (), (), (a, b, c))
    prepare(first, config, memo)
    with pytest.raises(ValueError, match="one holder"):  # d takes b's GPU 3 while b still runs
        prepare(dataclasses.replace(first, running=(a, b, c, _running("d", (3, 5)))), config, memo)
    then = dataclasses.replace(first, running=(a, c, _running("d", (3, 5))), pending=(PendingJob(b.job),))
    _same(prepare(then, config, memo), prepare(then, config, ClassMemo()))
