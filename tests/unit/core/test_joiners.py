"""`joiners_step` against the full placement step: on random histories (`simulate`), after each
cycle's full step, some waiting jobs leave, some change, new ones join and time moves on; when
`joiners_step` answers, the full step on the new waiting jobs gives the jobs it answered before
their answers and the joiners `joiners_step`'s, under every policy."""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given
from hypothesis import strategies as st

from corral.core import PendingJob, SchedulerConfig, Snapshot
from corral.core.joiners import head_of, joiners_step
from corral.core.steps import placement_step
from tests.unit.core.test_core_properties import POLICIES, SETTINGS, clusters, named, queue_trees, random_job, simulate
from tests.unit.core.test_preemptors import full_of_one_queue


def _check_joiners(snap: Snapshot, config: SchedulerConfig, rng: random.Random, seen: dict[str, int]) -> None:
    before = placement_step(snap, config)
    head = head_of(snap, before)
    if head is None:
        return
    others = [p for p in snap.pending if p is not head]
    left = {p.job.id for p in others if rng.random() < 0.3}
    changed = [dataclasses.replace(p, job=dataclasses.replace(p.job, priority=rng.choice([0, 1, 5])))
               for p in others if p.job.id not in left and rng.random() < 0.2]
    names = sorted({q.name for q in snap.queues} | {p.job.queue for p in snap.pending})
    joined = [PendingJob(random_job(rng, 1000 + i, snap.now + 1.0, names, False)) for i in range(rng.randint(0, 4))]
    joined = [dataclasses.replace(p, job=dataclasses.replace(p.job, id=f"new{i}")) for i, p in enumerate(joined)]
    joined += changed
    gone = left | {p.job.id for p in changed}
    now = snap.now + rng.choice([0.0, 1.0, 30.0])
    answers = joiners_step(dataclasses.replace(snap, now=now, pending=(head, *joined)), config, head)
    if answers is None:
        seen["full"] += 1
        return
    seen["joiners"] += 1
    assert sorted(d.job_id for d in answers) == sorted(p.job.id for p in joined)
    after = dataclasses.replace(snap, now=now, pending=(*(p for p in snap.pending if p.job.id not in gone), *joined))
    expected = {d.job_id: d for d in before if d.job_id not in gone} | {d.job_id: d for d in answers}
    full = {d.job_id: d for d in placement_step(after, config)}
    assert full == expected, {k: (full.get(k), expected.get(k)) for k in full.keys() | expected.keys()
                              if full.get(k) != expected.get(k)}


@SETTINGS
@given(data=st.data(), policy=st.sampled_from(POLICIES), seed=st.integers(0, 2**16), simple=st.booleans())
def test_joiners_get_the_full_steps_answers(data, policy, seed, simple):
    cluster = data.draw(clusters())
    capacity = sum(len(n.gpus) for n in cluster.nodes)
    queues = data.draw(queue_trees(capacity))
    config = named(policy)
    rng = random.Random(seed)
    seen = {"full": 0, "joiners": 0}
    simulate(cluster, queues, config, seed, 12, simple, lambda snap, config, _: _check_joiners(snap, config, rng, seen))


def test_a_full_backlog_answers_joiners_alone():
    """The CLI bench's shape: a full cluster, a backlog of one queue; a new job is answered by a
    cycle over the first job and itself, as the full step answers it."""
    config = SchedulerConfig.named("corral")
    snap = full_of_one_queue(50)
    before = placement_step(snap, config)
    head = head_of(snap, before)
    assert head is not None
    new = PendingJob(dataclasses.replace(snap.pending[-1].job, id="w99999", submit_time=999.0))
    answers = joiners_step(dataclasses.replace(snap, pending=(head, new)), config, head)
    assert answers is not None and [d.job_id for d in answers] == ["w99999"]
    full = placement_step(dataclasses.replace(snap, pending=(*snap.pending, new)), config)
    assert full[-1] == answers[0] and full[:-1] == before
    urgent = PendingJob(dataclasses.replace(new.job, id="urgent", priority=5))
    assert joiners_step(dataclasses.replace(snap, pending=(head, urgent)), config, head) is None
