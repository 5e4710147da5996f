"""`SchedulerConfig.level_protection_seconds` (`core.protection`) against its plain definition: a
running job preempted n times before is no level victim while its current run is shorter than
the protection x (2**n - 1), and never from the protection's count on; priority and reclaim still
take it; the history the core reads is the budget's and the protection's count
(tests/unit/sim/test_preemption_history.py replays with it trimmed so)."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import given
from hypothesis import strategies as st

from corral.core import Cluster, PendingJob, Preempt, QueueConfig, SchedulerConfig, schedule
from corral.core.preemption import Preemptors
from corral.core.protection import COUNT_CAP, level_protected, protected_for, times_read

from .builders import job, running, snapshot
from .test_core_properties import SETTINGS as _SETTINGS

SETTINGS = _SETTINGS.__class__(_SETTINGS, max_examples=60)

THRESHOLD = 500.0
BASE = 100.0


def _config(base: float = BASE, policy: str = "fair-las", count: int = 0) -> SchedulerConfig:
    return dataclasses.replace(SchedulerConfig.named(policy), las_thresholds=(THRESHOLD,),
                               level_protection_seconds=base, level_protection_count=count, starvation_limit=0.0,
                               preemption_budget=0)


def _plain(n: int, base: float, count: int) -> float:
    """The protection of a run after n preemptions, as the module docstring says it."""
    if n == 0:
        return 0.0
    if count and n >= count:
        return math.inf
    return base * (2.0 ** min(n, COUNT_CAP) - 1.0) if base > 0 else 0.0


def _victims(decisions: list) -> set[str]:
    return {v for d in decisions if isinstance(d, Preempt) for v in d.victims}


@given(n=st.integers(0, 80), base=st.floats(0.0, 1e4), count=st.integers(0, 40))
def test_the_protection_is_the_base_times_two_to_the_count_less_one(n: int, base: float, count: int) -> None:
    assert protected_for(n, _config(base, count=count)) == _plain(n, base, count)
    assert protected_for(n, _config(base, "corral", count)) == 0.0  # FAIR_LAS only
    assert protected_for(n, _config(0.0)) == 0.0


@SETTINGS
@given(n=st.integers(0, 6), run=st.floats(0.0, 8000.0), base=st.sampled_from([0.0, BASE]),
       priority=st.sampled_from([0, 0, 5]), count=st.sampled_from([0, 0, 2, 4]))
def test_a_job_preempted_n_times_is_a_level_victim_once_its_run_outlasts_its_protection(
    n: int, run: float, base: float, priority: int, count: int
) -> None:
    """1x1, queue a: `old` (level 1, just checkpointed, preempted n times before) has run `run`
    seconds; `new` (level 0, priority `priority`) waits. `new` preempts it by level exactly when the
    run is at least base x (2**n - 1) and n is below the count; a higher priority preempts it
    whatever its history."""
    config = _config(base, count=count)
    now = 10_000.0
    old = running(job("old", queue="a"), [("n000", (0,))], start=now - run, checkpoint=now,
                  attained_gpu_seconds=THRESHOLD, preempted_at=tuple(float(i) for i in range(n)))
    new = PendingJob(job("new", queue="a", submit_time=now, priority=priority))
    snap = snapshot(Cluster.uniform(1, 1, "H100"), [new], [old], queues=[QueueConfig("a", 1)], now=now)
    exposed = run >= _plain(n, base, count)
    assert level_protected(old, now, config) == (not exposed)
    assert _victims(schedule(snap, config)) == ({"old"} if exposed or priority > 0 else set())
    if exposed:
        assert Preemptors([new]).may_preempt([old], now, config)


@SETTINGS
@given(n=st.integers(1, 6), run=st.floats(0.0, 3000.0), count=st.sampled_from([0, 1, 3]))
def test_reclaim_takes_a_protected_job(n: int, run: float, count: int) -> None:
    """1x2: `old` of queue a (preempted n times, just started again) borrows queue b's GPU; b's
    waiting job reclaims it however short its run, even from the count on."""
    config = _config(count=count)
    now = 10_000.0
    mine = running(job("mine", queue="a"), [("n000", (0,))], start=0.0)  # costlier: no checkpoint
    old = running(job("old", queue="a"), [("n000", (1,))], start=now - run, checkpoint=now,
                  attained_gpu_seconds=THRESHOLD, preempted_at=tuple(float(i) for i in range(n)))
    snap = snapshot(Cluster.uniform(1, 2, "H100"), [PendingJob(job("b1", queue="b", submit_time=now))],
                    [mine, old], queues=[QueueConfig("a", 1), QueueConfig("b", 1)], now=now)
    assert level_protected(old, now, config) == (run < _plain(n, BASE, count))
    assert _victims(schedule(snap, config)) == {"old"}


@given(budget=st.integers(-1, 40), base=st.sampled_from([0.0, BASE]), count=st.integers(0, 40),
       policy=st.sampled_from(["fair-las", "corral"]))
def test_the_times_read_are_the_budgets_and_the_protections_count(budget: int, base: float, count: int,
                                                                  policy: str) -> None:
    config = dataclasses.replace(_config(base, policy, count), preemption_budget=budget)
    assert times_read(config) == max(budget, COUNT_CAP if base > 0 else 0, count, 0)
