"""The records of seeded replays under contention, pinned: a change that is meant to keep every
schedule (a cache, state kept between cycles or rounds, a faster path) keeps these hashes.

One seeded workload (120 jobs of 1 to 2x8 GPUs on 3 x 8 GPUs, three queues with equal guarantees,
priorities, non-preemptible jobs, checkpoint graces and estimates) replayed under corral, fair-las
and las by both pipelines; each hash is sha256 over every record's id, start, end, preemptions
and placements (node and GPUs per rank). A policy change that moves a schedule says so and pins
the new hash.
"""

from __future__ import annotations

import random

import pytest

from corral.core import Cluster, QueueConfig
from corral.sim import Workload, run_simulation
from corral.sim.api import SimResult
from corral.sim.workload import TopologySpec, sim_job

QUEUES = [QueueConfig(f"q{i}", 8) for i in range(3)]

PINNED = {
    ("corral", "cycle"): "c2668abeda511d7a48f8681fb63dca6208ee44ec32b2049ab430fa0a7de90de8",
    ("corral", "services"): "8c802956ca1a29564c5035c72b448968762a16821aa0a84ffdafc4bf07926c43",
    ("fair-las", "cycle"): "b74cd904fa21faff5ffca6f1341f743cd8cce2e7e61df7e410cb00f5d0609cd6",
    ("fair-las", "services"): "73c16c1d3cc67b3af790791f43ae0f2e4e795f5ec37da830eeecc31960a1f414",
    ("las", "cycle"): "c9dbae71cba92f826acff0894299866f3ba94072e052b01c8eff5155ab0acf34",
    ("las", "services"): "7b40bed0d20ba83b08b798a1dcbfc4a6ed4b4b81f12e1c895192fff2bceedb83",
}


def workload(seed: int = 7) -> Workload:
    rng = random.Random(seed)
    node = TopologySpec(replica="node")
    jobs = []
    for i in range(120):
        per, replicas = rng.choice([(1, 1), (2, 1), (4, 1), (8, 1), (8, 2)])
        jobs.append(sim_job(f"j{i:03d}", f"q{rng.randrange(3)}", round(rng.uniform(0, 4000), 3),
                            rng.choice([60.0, 300.0, 900.0, 2400.0]), replicas, per,
                            priority=rng.choice([0, 0, 0, 100]), topology=node,
                            preemptible=rng.random() < 0.85, checkpoint_grace_seconds=rng.choice([0.0, 30.0]),
                            checkpoint_interval_seconds=rng.choice([120.0, 600.0]),
                            estimated_runtime_seconds=rng.choice([None, 600.0, 2400.0])))
    jobs.sort(key=lambda j: (j.submit, j.id))
    return Workload(tuple(jobs), f"seed{seed}")


def replay(policy: str, pipeline: str) -> SimResult:
    return run_simulation(workload(), Cluster.uniform(3, 8, "H100"), policy=policy, queues=QUEUES, pipeline=pipeline)


@pytest.mark.parametrize(("policy", "pipeline"), sorted(PINNED))
def test_the_schedule_is_the_pinned_one(policy: str, pipeline: str) -> None:
    assert replay(policy, pipeline).schedule_hash() == PINNED[(policy, pipeline)]


def test_every_job_of_the_pinned_workload_finishes_under_las_services() -> None:
    """Under las, the quota step's play-out refuses reservations a waiting job would take back at
    once; on a cluster where nothing runs a round still starts a job (`reservation._start_one`)."""
    assert replay("las", "services").summary.finished == 120


if __name__ == "__main__":
    for key in sorted(PINNED):
        print(key, replay(*key).schedule_hash())
