"""RunningIndex keeps, through any history of changes, what a cycle would compute from all running jobs.

Why: `SchedulerState` hands each cycle the running jobs sorted by id, the lowest priority per
queue, a bound on the most attained service and who may have a LAS threshold's service from a
`RunningIndex` instead of a pass over every running job; a wrong answer would hide LAS victims.
Random histories (adds, removals, checkpoints, more attained service) are compared with the plain
definitions at random times, including attained service and start times large enough for float
rounding to matter.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from corral.core import RunningJob
from corral.core.running import RunningIndex

from .builders import job, running


def _random_running(rng: random.Random, n: int, now: float) -> RunningJob:
    scale = rng.choice([1.0, 1e3, 1e6, 1e9])
    j = job(f"j{n:04d}", replicas=rng.choice([1, 1, 2, 4]), gpus=rng.choice([1, 2, 8]),
            queue=rng.choice(["a", "b", "c"]), priority=rng.choice([0, 0, 1, 5]))
    start = now - rng.random() * scale
    return running(j, [("n0", (0,))], start=start, attained_gpu_seconds=rng.random() * scale * rng.choice([0, 1, 7]))


@pytest.mark.parametrize("seed", range(20))
def test_running_index_matches_the_plain_definitions(seed: int) -> None:
    rng = random.Random(seed)
    index = RunningIndex()
    jobs: dict[str, RunningJob] = {}
    now = rng.choice([0.0, 5e6, 3e9])
    for n in range(300):
        now += rng.random() * rng.choice([0.0, 10.0, 1e4])
        roll = rng.random()
        if roll < 0.5 or not jobs:
            r = _random_running(rng, n, now)
            jobs[r.job.id] = r
            index.add(r)
        elif roll < 0.75:
            r = jobs.pop(rng.choice(sorted(jobs)))
            index.remove(r)
        else:
            old = jobs[rng.choice(sorted(jobs))]
            r = dataclasses.replace(old, last_checkpoint_time=now) if rng.random() < 0.5 else dataclasses.replace(
                old, attained_gpu_seconds=old.attained_gpu_seconds + rng.random() * 1e5
            )
            jobs[r.job.id] = r
            index.replace(old, r)
        assert index.jobs == sorted(jobs.values(), key=lambda r: r.job.id)
        lowest: dict[str, int] = {}
        for r in jobs.values():
            lowest[r.job.queue] = min(lowest.get(r.job.queue, r.job.priority), r.job.priority)
        assert index.lowest_priority() == lowest
        most = max((r.attained(now) for r in jobs.values()), default=-math.inf)
        bound = index.most_attained_bound(now)
        assert bound is not None and bound >= most
        for q in {r.job.queue for r in jobs.values()} | {"nobody"}:  # and per queue
            mine = [r.attained(now) for r in jobs.values() if r.job.queue == q]
            in_q = index.most_attained_bound(now, q)
            assert in_q is not None and in_q >= max(mine, default=-math.inf)
        for need in (most, most - 1.0, most * 0.5, rng.random() * (abs(most) + 1.0), -math.inf):
            maybe = index.attained_at_least(need, now)
            assert maybe is not None and len({r.job.id for r in maybe}) == len(maybe)
            assert {r.job.id for r in maybe} >= {r.job.id for r in jobs.values() if r.attained(now) >= need}
            assert all(r is jobs[r.job.id] for r in maybe)
        if jobs:  # and tight: within the margin of the largest magnitude involved, so it stays useful
            span = abs(now) + max(abs(r.start_time) for r in jobs.values())
            scale = max(abs(r.attained_gpu_seconds) + 2 * span * r.job.total_gpus for r in jobs.values())
            assert bound - most <= 1e-8 * (1.0 + scale)


def test_a_job_starting_later_than_now_asks_for_the_exact_answer() -> None:
    index = RunningIndex()
    index.add(running(job("a"), [("n0", (0,))], start=100.0))
    assert index.most_attained_bound(50.0) is None
    assert index.attained_at_least(0.0, 50.0) is None
    assert index.most_attained_bound(100.0) is not None
