"""The simulator's periodic checkpoints: the last one is at or before now, the next one after it.

Found by hypothesis (test_pipeline_agreement): a run started at 145.004 with a 60 s interval was
asked at 1045.004 for its last checkpoint; 1045.004 - 145.004 rounds to 899.9999999999999, which
floors to 14 periods, so the next checkpoint was 1045.004 again and the engine looped forever.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.core import Cluster, QueueConfig
from corral.sim import Workload, run_simulation
from corral.sim.engine import last_periodic_checkpoint
from corral.sim.workload import TopologySpec, sim_job


def test_the_rounded_down_period_is_counted() -> None:
    last = last_periodic_checkpoint(145.004, 1045.004, 60.0)
    assert last <= 1045.004 < last + 60.0


@given(start=st.floats(0, 1e7), elapsed=st.floats(0, 1e7), interval=st.floats(1.0, 1e5))
def test_last_is_at_or_before_now_and_the_next_after_it(start: float, elapsed: float, interval: float) -> None:
    now = start + elapsed
    last = last_periodic_checkpoint(start, now, interval)
    assert last <= now < last + interval


@pytest.fixture
def within_60s() -> Iterator[None]:
    def hang(*_: object) -> None:
        raise TimeoutError("the simulation did not finish within 60 s")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(60)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("pipeline", ["cycle", "services"])
def test_the_world_hypothesis_found_finishes(pipeline: str, within_60s: None) -> None:
    def job(i: str, submit: float, duration: float, replicas: int, per: int, priority: int, preemptible: bool,
            grace: float, estimate: float | None):  # type: ignore[no-untyped-def]
        return sim_job(i, "q0", submit, duration, replicas, per, priority=priority,
                       topology=TopologySpec(replica="node"), preemptible=preemptible,
                       checkpoint_grace_seconds=grace, checkpoint_interval_seconds=60.0,
                       estimated_runtime_seconds=estimate)

    jobs = (job("j2", 0.002, 1000, 1, 1, 0, True, 0, 100), job("j5", 0.005, 100, 1, 1, 0, True, 5, 100),
            job("j6", 0.006, 30, 2, 2, 0, True, 5, None), job("j7", 0.007, 30, 1, 8, 500, False, 5, 1000),
            job("j8", 0.008, 100, 1, 8, 0, True, 5, 100), job("j3", 10.003, 100, 2, 2, 500, True, 0, 1000),
            job("j4", 10.004, 1000, 2, 2, 100, True, 5, 100), job("j0", 50.0, 100, 2, 4, 0, True, 5, 1000),
            job("j1", 300.001, 100, 1, 2, 0, False, 0, 100), job("j9", 300.009, 100, 1, 4, 0, True, 0, 1000))
    result = run_simulation(Workload(jobs, "found"), Cluster.uniform(1, 8, "H100"), policy="corral",
                            queues=(QueueConfig("q0", 8, max_gpus=12),), pipeline=pipeline)
    assert result.summary.finished == len(jobs)
