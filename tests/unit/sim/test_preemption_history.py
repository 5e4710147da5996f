"""The simulator's trimmed preemption histories (`corral.sim.histories`) against the plain
definition: every preemptor and every preemption time kept for good.

1. What the core reads is the same: for a job not finished, `budget_spent` gives the same answer on
   the kept times as on all of them, at any time from the last one on, for any budget and window;
   and its kept preemptors are all of them less those that finished.
2. The schedule is the same: replays with the trimmed histories and with full ones give the same
   records (starts, ends, placements GPU by GPU, preemptions) on random small contended workloads
   under every preempting policy, with tight and loose budgets, and with fair-las's level protection
   (`protection`, which counts the times up to a cap).
"""

from __future__ import annotations

import dataclasses
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import Cluster, SchedulerConfig
from corral.core.preemption import budget_spent
from corral.sim import SimJob, Workload, engine, run_simulation
from corral.sim.histories import PreemptionHistory
from corral.sim.workload import TopologySpec, sim_job

JOBS = [f"j{i}" for i in range(5)]

steps = st.lists(st.tuples(st.sampled_from(["asked", "stopped", "finished"]), st.sampled_from(JOBS),
                           st.sampled_from(JOBS), st.sampled_from([0.0, 0.0, 1.0, 5.0, 50.0])), max_size=60)


@settings(max_examples=300, deadline=None)
@given(steps, st.integers(-1, 4), st.sampled_from([1.0, 10.0, 60.0, 600.0]), st.sampled_from([0.0, 0.5, 5.0, 1e4]))
def test_what_the_core_reads_is_the_plain_definitions(ops: list, budget: int, window: float, later: float) -> None:
    config = dataclasses.replace(SchedulerConfig(), preemption_budget=budget, preemption_budget_seconds=window)
    kept, full = PreemptionHistory(budget), PreemptionHistory(budget, full=True)
    finished: set[str] = set()
    now = 0.0
    for op, job, other, gap in ops:
        now += gap
        if job in finished:
            continue  # a finished job is never asked or stopped again
        for h in (kept, full):
            if op == "asked":
                h.asked(job, now)
            elif op == "stopped":
                h.stopped_for(job, other)
            else:
                h.finished(job)
        if op == "finished":
            finished.add(job)
        for j in set(JOBS) - finished:
            assert kept.by(j) == full.by(j) - finished
            for at in (now, now + later):
                assert budget_spent(kept.at(j), at, config) == budget_spent(full.at(j), at, config)
            assert len(kept.at(j)) <= max(budget, 0)


@st.composite
def contended(draw: st.DrawFn) -> tuple[Cluster, tuple[SimJob, ...]]:
    """One or two 8-GPU nodes, two queues, up to 14 jobs of 1-8 GPUs arriving close together,
    short and long, so jobs are preempted again and again (and some preemptors finish first)."""
    nodes = draw(st.integers(1, 2))
    jobs = []
    for i in range(draw(st.integers(2, 14))):
        jobs.append(sim_job(
            f"j{i}", f"q{i % 2}", draw(st.sampled_from([0.0, 5.0, 20.0, 100.0, 400.0])) + i * 0.001,
            draw(st.sampled_from([10.0, 60.0, 300.0, 3000.0])), 1, draw(st.sampled_from([1, 2, 4, 8])),
            priority=draw(st.sampled_from([0, 0, 100])), topology=TopologySpec(replica="node"),
            checkpoint_grace_seconds=draw(st.sampled_from([0.0, 5.0])), checkpoint_interval_seconds=20.0))
    jobs.sort(key=lambda j: j.submit)
    return Cluster.uniform(nodes, 8, "H100"), tuple(jobs)


def _records(world: tuple[Cluster, tuple[SimJob, ...]], config: SchedulerConfig, pipeline: str) -> list:
    cluster, jobs = world
    result = run_simulation(Workload(jobs, "drawn"), cluster, config=config, pipeline=pipeline)
    return [(r.id, r.start, r.end, r.preemptions, r.lost_gpu_seconds,
             [(p.start, p.end, p.ranks) for p in r.placements]) for r in result.records]


def _full(budget: int, *, full: bool = False) -> PreemptionHistory:
    return PreemptionHistory(budget, full=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(contended(), st.sampled_from(["fair-las", "fair-las-reset", "fair-las-protect", "las", "corral", "priority"]),
       st.sampled_from([(1, 1e6), (2, 600.0), (2, 50.0), (0, 600.0)]), st.sampled_from(["cycle", "services"]))
def test_the_schedule_is_the_one_with_full_histories(world, policy: str, budget: tuple[int, float],
                                                     pipeline: str) -> None:
    name = policy.removesuffix("-reset").removesuffix("-protect")
    reset, protect = policy.endswith("-reset"), policy.endswith("-protect")
    config = dataclasses.replace(SchedulerConfig.named(name), preemption_budget=budget[0],
                                 preemption_budget_seconds=budget[1], las_thresholds=(200.0,),
                                 las_min_gap_gpu_seconds=50.0,
                                 starvation_limit=2.0 if name == "fair-las" else 0.0,
                                 promotion_resets_level=reset, level_protection_seconds=5.0 if protect else 0.0,
                                 level_protection_count=3 if protect else 0)
    trimmed = _records(world, config, pipeline)
    with mock.patch.object(engine, "PreemptionHistory", _full):
        plain = _records(world, config, pipeline)
    assert trimmed == plain
