"""The quota round's waiting jobs kept between rounds (`core.backlog.KeptBacklog`) against the plain
definition (`Backlog.of` on the snapshot): after any sequence of jobs coming, changing (queue,
size, priority, user, attained service, taking or giving back quota) and going, the kept copy is
the derived one, and `quota_round` decides the same from either, under every order policy.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.core import OrderPolicy, PendingJob, SchedulerConfig, Snapshot
from corral.core.backlog import Backlog, KeptBacklog
from corral.core.reservation import quota_round
from tests.unit.core.test_core_properties import random_job
from tests.unit.core.test_quota_reclaim_loops import SETTINGS, worlds

POLICIES = (
    SchedulerConfig(),
    SchedulerConfig(order=OrderPolicy.FIFO),
    SchedulerConfig(order=OrderPolicy.LAS),
    SchedulerConfig(order=OrderPolicy.FAIR_LAS, las_thresholds=(100.0, 5000.0)),
    SchedulerConfig(reclaim=False),
)


def _pending(rng: random.Random, n: int, names: list[str]) -> PendingJob:
    job = random_job(rng, n, rng.choice([0.0, 10.0, rng.uniform(0, 900)]), names, rng.random() < 0.5)
    job = dataclasses.replace(job, user=rng.choice([None, "ann", "bob"]))
    return PendingJob(job, attained_gpu_seconds=rng.choice([0.0, 50.0, 6000.0]))


def same_backlog(kept: Backlog, plain: Backlog) -> None:
    assert kept.waiting == plain.waiting
    assert kept.holders == plain.holders
    assert {q: list(js) for q, js in kept.by_queue.items()} == {q: list(js) for q, js in plain.by_queue.items()}
    assert kept.classes == plain.classes
    assert kept.samples.keys() == plain.samples.keys()
    for (q, gpus, user), job in kept.samples.items():  # any job of its class (a check reads no more)
        assert (job.queue, job.total_gpus, job.user) == (q, gpus, user) and job.id in kept.waiting
    assert kept.at == plain.at
    assert kept.top == plain.top


@SETTINGS
@given(world=worlds(), seed=st.integers(0, 2**16), per_user=st.booleans(), steps=st.integers(1, 40))
def test_the_kept_backlog_is_the_derived_one_and_the_round_decides_alike(world, seed, per_user, steps):
    cluster, queues, _, run, _ = world
    if per_user:
        queues = tuple(dataclasses.replace(q, max_gpus_per_user=2) if i == 0 else q for i, q in enumerate(queues))
    names = [q.name for q in queues] + ["nowhere"]  # a queue the tree does not know
    rng = random.Random(seed)
    kept = KeptBacklog()
    now: dict[str, tuple[PendingJob, bool]] = {}
    for _ in range(steps):
        n = 200 + rng.randrange(12)  # apart from the running jobs' ids
        if f"j{n}" in now and rng.random() < 0.3:
            kept.drop(f"j{n}")
            del now[f"j{n}"]
            continue
        p = _pending(rng, n, names)
        holds = rng.random() < 0.25
        kept.put(p, holds)
        now[p.job.id] = (p, holds)
        kept.drop("never-put")  # a job the backlog does not hold: nothing
    pending = tuple(p for _, (p, _) in sorted(now.items()))
    reserved = {i for i, (_, holds) in now.items() if holds}
    snap = Snapshot(1000.0, cluster, queues, pending, tuple(run))
    frozen = kept.frozen()
    same_backlog(frozen, Backlog.of(snap, reserved))
    assert len(kept) == len(now)
    for config in POLICIES:
        kept_round, plain_round = quota_round(snap, config, reserved=reserved, backlog=frozen), quota_round(
            snap, config, reserved=reserved)
        assert [d.job_id for d in kept_round.decisions] == [d.job_id for d in plain_round.decisions], config.order
        assert kept_round == plain_round


def test_a_frozen_copy_does_not_move_with_the_kept_backlog() -> None:
    """The service changes the kept backlog while a round reads its copy in a thread."""
    kept = KeptBacklog()
    a = PendingJob(random_job(random.Random(1), 1, 0.0, ["q"], True))
    kept.put(a, False)
    frozen = kept.frozen()
    kept.put(PendingJob(random_job(random.Random(2), 2, 1.0, ["q"], True)), False)
    kept.drop(a.job.id)
    assert list(frozen.waiting) == [a.job.id] and list(frozen.by_queue["q"]) == [a]
    assert frozen.classes == {("q", a.job.total_gpus, None): 1} and frozen.at == {"q": 1}


if __name__ == "__main__":
    pytest.main([__file__])
