"""The simulator's schedule on small hand-made workloads equals the one worked out by hand.

Each case states the expected schedule in its docstring; the numbers follow from the engine's
rules (checkpoint grace, periodic checkpoints, requeue with the lost work) and the policy.
"""

from __future__ import annotations

import pytest

from corral.core import Cluster, QueueConfig
from corral.sim import SimJob, Workload, check_schedule, result_document, run_simulation
from corral.sim.api import SimResult
from corral.sim.workload import TopologySpec, sim_job

NODE = TopologySpec(replica="node")


def _run(jobs: list[SimJob], cluster: Cluster, policy: str, queues: list[QueueConfig] | None = None) -> SimResult:
    result = run_simulation(Workload(tuple(jobs), "hand-made"), cluster, policy=policy, queues=queues)
    assert check_schedule(result_document(result), cluster) == []
    return result


def _spans(result: SimResult) -> dict[str, list[tuple[float, float]]]:
    return {r.id: [(p.start, p.end) for p in r.placements] for r in result.records}


def _fifo_jobs() -> list[SimJob]:
    return [
        sim_job("a", "q", 0, 100, 1, 8, topology=NODE, estimated_runtime_seconds=100),
        sim_job("b", "q", 1, 50, 2, 8, topology=NODE),
        sim_job("c", "q", 2, 10, 1, 1, topology=NODE, estimated_runtime_seconds=10),
    ]


def test_fifo_head_of_line_gang_blocks_a_small_job_that_would_fit() -> None:
    """2x8: a (8 GPUs) runs 0-100; b (2x8) must wait for a; c (1 GPU) fits at t=2 but strict FIFO
    keeps it behind b: b 100-150, c 150-160."""
    result = _run(_fifo_jobs(), Cluster.uniform(2, 8, "H100"), "fifo")
    assert _spans(result) == {"a": [(0, 100)], "b": [(100, 150)], "c": [(150, 160)]}


def test_easy_backfill_runs_the_small_job_before_the_reservation() -> None:
    """Same workload under EASY backfill: b reserves both nodes at t=100 (a's estimate); c's
    estimate ends at 12 < 100, so c runs 2-12 without delaying b."""
    result = _run(_fifo_jobs(), Cluster.uniform(2, 8, "H100"), "backfill")
    assert _spans(result) == {"a": [(0, 100)], "b": [(100, 150)], "c": [(2, 12)]}


def test_gang_waits_for_a_completion_then_starts_all_ranks_at_once() -> None:
    """2x8: a (4 GPUs, 0-100) and b (4 GPUs, 0-200) hold GPUs on the cluster; the 2x8 gang c
    (t=1) needs two whole nodes, gets no partial allocation, and starts at 200 on both nodes."""
    jobs = [
        sim_job("a", "q", 0, 100, 1, 4, topology=NODE),
        sim_job("b", "q", 0, 200, 1, 4, topology=NODE),
        sim_job("c", "q", 1, 50, 2, 8, topology=NODE),
    ]
    result = _run(jobs, Cluster.uniform(2, 8, "H100"), "corral")
    spans = _spans(result)
    assert spans["c"] == [(200, 250)]
    gang = result.records[2].placements[0]
    assert sorted(r.node for r in gang.ranks) == ["node-0", "node-1"] or len({r.node for r in gang.ranks}) == 2
    assert all(len(r.gpus) == 8 for r in gang.ranks)
    assert result.summary.preemptions == 0


def test_preemption_loses_the_work_since_the_last_checkpoint() -> None:
    """1x8, priority policy: low (8 GPUs, 10,000 s, checkpoints every 1,800 s, 30 s grace) starts
    at 0; high (8 GPUs, priority 1000, 100 s) arrives at 4,000 and preempts it. low holds its GPUs
    through the grace until 4,030; its last checkpoint was at 3,600, so it loses 430 s x 8 GPUs =
    3,440 GPU-s and 6,400 s remain. high runs 4,030-4,130; low restarts at 4,130 and ends 10,530."""
    jobs = [
        sim_job(
            "low",
            "q",
            0,
            10_000,
            1,
            8,
            priority=100,
            topology=NODE,
            checkpoint_grace_seconds=30,
            checkpoint_interval_seconds=1800,
        ),
        sim_job("high", "q", 4000, 100, 1, 8, priority=1000, topology=NODE),
    ]
    result = _run(jobs, Cluster.uniform(1, 8, "H100"), "priority")
    assert _spans(result) == {"low": [(0, 4030), (4130, 10_530)], "high": [(4030, 4130)]}
    low = result.records[0]
    assert (low.preemptions, low.lost_gpu_seconds) == (1, 3440.0)
    assert result.summary.gpu_seconds_lost_to_preemption == 3440.0


def test_victim_that_finishes_within_its_grace_just_finishes() -> None:
    """As above but low needs only 4,010 s: asked to checkpoint at 4,000, it completes at 4,010
    inside its 30 s grace, is not counted as preempted, and high starts at 4,010."""
    jobs = [
        sim_job("low", "q", 0, 4010, 1, 8, priority=100, topology=NODE, checkpoint_grace_seconds=30),
        sim_job("high", "q", 4000, 100, 1, 8, priority=1000, topology=NODE),
    ]
    result = _run(jobs, Cluster.uniform(1, 8, "H100"), "priority")
    assert _spans(result) == {"low": [(0, 4010)], "high": [(4010, 4110)]}
    assert result.records[0].preemptions == 0


def test_queue_under_its_guarantee_reclaims_borrowed_gpus() -> None:
    """1x8, queues a and b guaranteed 4 each. a's eight 1-GPU jobs (1,000 s) borrow b's half at 0.
    b's four jobs arrive at 100: Corral reclaims 4 of a's jobs (30 s grace), b runs 130-230; the
    four victims lost 130 s each and rerun 230-1,230."""
    jobs = [sim_job(f"a{i}", "a", 0, 1000, 1, 1, topology=NODE) for i in range(8)]
    jobs += [sim_job(f"b{i}", "b", 100, 100, 1, 1, topology=NODE) for i in range(4)]
    queues = [QueueConfig("a", guaranteed_gpus=4), QueueConfig("b", guaranteed_gpus=4)]
    result = _run(jobs, Cluster.uniform(1, 8, "H100"), "corral", queues)
    spans = _spans(result)
    assert all(spans[f"b{i}"] == [(130, 230)] for i in range(4))
    victims = [r for r in result.records if r.queue == "a" and r.preemptions]
    assert len(victims) == 4
    assert all(spans[v.id] == [(0, 130), (230, 1230)] and v.lost_gpu_seconds == 130 for v in victims)


@pytest.mark.parametrize("policy", ["corral", "fifo", "priority", "backfill", "las"])
def test_every_policy_finishes_every_job_of_a_small_mix(policy: str) -> None:
    jobs = [
        sim_job(f"j{i}", f"q{i % 3}", i * 7.0, 50 + (i * 37) % 400, 1 + (i % 4 == 0), 1 + i % 8, topology=NODE)
        for i in range(60)
    ]
    result = _run(jobs, Cluster.uniform(4, 8, "H100"), policy)
    assert result.summary.finished == 60


@pytest.mark.parametrize("policy", ["fifo", "backfill"])
def test_skipping_futile_cycles_does_not_change_the_schedule(policy: str) -> None:
    from corral.core import SchedulerConfig
    from corral.sim.engine import Simulator
    from corral.sim.inputs import equal_share_queues

    jobs = tuple(
        sim_job(
            f"j{i}",
            f"q{i % 3}",
            i * 5.0,
            40 + (i * 53) % 300,
            1 + (i % 5 == 0),
            1 + (i * 3) % 8,
            topology=NODE,
            estimated_runtime_seconds=60 + (i * 53) % 300,
        )
        for i in range(80)
    )
    workload = Workload(jobs, "mix")
    cluster = Cluster.uniform(3, 8, "H100")
    queues = equal_share_queues(workload.queues, cluster.total_gpus)
    runs = []
    for skip in (True, False):
        sim = Simulator(workload, cluster, queues, SchedulerConfig.named(policy), skip_futile_cycles=skip)
        outcome = sim.run()
        runs.append(([r.to_json() for r in outcome.records], sim.stats))
    (skipped, with_skip), (full, without_skip) = runs
    assert skipped == full
    assert with_skip.skipped_cycles > 0 and with_skip.cycles < without_skip.cycles
