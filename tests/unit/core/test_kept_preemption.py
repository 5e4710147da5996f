"""The play-out's preemption step from kept state (`core.kept_preemption.KeptPreemption`) against its
plain definition, `preemption_step(after_placing(snapshot, placed, config), config)` from scratch.

The snapshots come from the scheduler-state histories (test_scheduler_state.py: arrivals, starts,
preemptions, requeues, checkpoints, cancellations, a waiting job's priority edited, nodes lost,
drained and back, GPUs out of service) under every policy; at each cycle the kept step is asked, as
a quota round asks it, about several plays on one snapshot (placement's whole answer, part of it,
none), the same snapshot's tuples again, and a copy of them; and a whole quota round decides alike
with memos kept across the history and with fresh ones.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.core import Cluster, Job, PendingJob, Place, SchedulerConfig, Snapshot
from corral.core.kept_preemption import KeptPreemption
from corral.core.reservation import reserve_quota
from corral.core.steps import StepMemos, after_placing, placement_step, preemption_step

from .test_core_properties import POLICIES, SETTINGS, named, queue_trees
from .test_core_properties import clusters as cluster_strategy
from .test_scheduler_state import _history, _Twin


class _Checked(_Twin):
    """A twin whose every cycle also asks a kept preemption step and kept round memos."""

    def __init__(self, cluster, queues, config: SchedulerConfig, plays: int) -> None:
        super().__init__(cluster, queues, config)
        self.kept = KeptPreemption()
        self.memos = StepMemos()
        self.plays = plays
        self.asked = 0

    def compare(self, now: float) -> list[object]:
        if self.pending and int(now) % 20 == 10:  # a waiting job changes (its priority edited)
            p = self.pending[sorted(self.pending)[int(now) % len(self.pending)]]
            self.add_pending(dataclasses.replace(p, job=dataclasses.replace(p.job, priority=p.job.priority + 1))
                             if self.pop_pending(p.job.id) else p)
        snap = Snapshot(now, self.cluster, self.queues, tuple(self.pending.values()), tuple(self.running.values()))
        config = self.config
        placed = [(d.job_id, d.placement) for d in placement_step(snap, config, explain=False)
                  if isinstance(d, Place)]
        for k in sorted({len(placed), len(placed) // 2, 0})[-self.plays:]:
            play = dict(placed[:k])
            want = preemption_step(after_placing(snap, play, config), config)
            assert self.kept.decide(snap, config, play) == want
            assert self.kept.decide(snap, config, play) == want  # the same tuples again
            copy = Snapshot(now, self.cluster, self.queues, tuple(snap.pending), tuple(snap.running))
            assert self.kept.decide(copy, config, play) == want
            self.asked += 1
        holding = frozenset(sorted(self.pending)[::3])
        assert reserve_quota(snap, config, reserved=holding, memos=self.memos) == reserve_quota(
            snap, config, reserved=holding)
        return super().compare(now)


@SETTINGS
@given(data=st.data(), policy=st.sampled_from(POLICIES), seed=st.integers(0, 2**16), plays=st.integers(1, 3))
def test_the_kept_preemption_step_decides_what_the_step_from_scratch_decides(data, policy, seed, plays):
    cluster = data.draw(cluster_strategy())
    queues = data.draw(queue_trees(max(cluster.usable_gpus, 1)))
    twin = _Checked(cluster, queues, named(policy), plays)
    _history(twin, seed, cycles=14)
    assert twin.asked >= 14


def test_a_failed_ask_leaves_no_half_moved_state():
    """A play naming a job that does not wait fails, and the next ask starts from scratch."""
    snap = Snapshot(0.0, Cluster(()), (), (), ())
    kept = KeptPreemption()
    try:
        kept.decide(snap, SchedulerConfig(), {"nobody": None})  # type: ignore[dict-item]
    except KeyError:
        pass
    else:
        raise AssertionError("a play of a job that does not wait must fail")
    assert kept._state is None
    assert kept.decide(snap, SchedulerConfig(), {}) == []


def test_a_job_listed_twice_is_refused_as_from_scratch():
    p = PendingJob(Job("a", "q", 1, 1, 0.0))
    snap = Snapshot(0.0, Cluster(()), (), (p, p), ())
    with pytest.raises(ValueError):
        preemption_step(snap, SchedulerConfig())
    with pytest.raises(ValueError):
        KeptPreemption().decide(snap, SchedulerConfig(), {})
