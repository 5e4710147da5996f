"""A SchedulerState's kept tables stay as large as what is live, however long it lives.

Why: a replay keeps one state for months of simulated time. A waiting job whose preemptors and
victims keep starting and ending changes its spared set (`eligibility.spared`) at each of them,
so its class key changes each time; a promoted job changes class too (`promotion_resets_level`).
A table keyed by every class key ever seen, or a heap of every promotion time ever pushed, grows
with the replay's history instead of its waiting jobs (the whole Philly replay under fair-las
grew to 14.8 GB). Here a state is driven through many such changes and its tables are checked
against the live jobs and classes; test_scheduler_state.py checks the same after every cycle of
its random histories.
"""

from __future__ import annotations

import dataclasses

from corral.core import Cluster, PendingJob, QueueConfig, SchedulerConfig
from corral.core.state import SchedulerState

from .builders import job, running

FAIR_LAS = SchedulerConfig.named("fair-las")


def kept_within_live(state: SchedulerState) -> None:
    """The class keys are those of live classes, and the promotion heap is at most twice the
    jobs with a promotion time (plus a constant)."""
    classes = state._members
    assert len(state._class_ids) == len(classes)
    assert sorted(state._class_ids.values()) == sorted(classes)
    promotions = state._promotions
    assert len(promotions.due) <= 2 * len(promotions.at) + 64


def test_a_waiting_job_whose_spared_set_keeps_changing_keeps_one_class_key() -> None:
    state = SchedulerState(Cluster.uniform(2, 8, "H100"), (QueueConfig("q", 16),), FAIR_LAS)
    preemptors = [f"x{i}" for i in range(400)]
    state.add_pending(PendingJob(job("w", gpus=8), preempted_by=frozenset(preemptors)))
    state.add_pending(PendingJob(job("v", gpus=8)))
    for i, x in enumerate(preemptors):  # each preemptor runs a while: w's spared set changes twice
        state.add_running(running(job(x), [("n000", (i % 8,))], start=float(i)))
        state.remove_running(x)
        kept_within_live(state)
    assert state.prepared(1000.0).spared == {}


def test_promotions_that_come_and_go_leave_no_table_behind() -> None:
    config = dataclasses.replace(FAIR_LAS, promotion_resets_level=True)
    state = SchedulerState(Cluster.uniform(1, 8, "H100"), (QueueConfig("q", 8),), config)
    for i in range(1000):  # requeued jobs: some promoted while they wait, most started again before
        now = 10.0 * i
        last_run = 1.0 if i % 10 == 0 else 1e6
        p = PendingJob(job(f"j{i}"), attained_gpu_seconds=50_000.0, requeued_at=now, last_run_seconds=last_run)
        state.add_pending(p)
        state.cycle(now + 5.0)
        if i % 10:
            state.remove_pending(p.job.id)
        kept_within_live(state)
    assert len(state.pending) == 100
