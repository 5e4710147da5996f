"""The quota round's shortcuts, each against its plain definition.

- `Exposure.among` (which holders a pass plays out again) answers once per (queue, priority,
  preemptible, protected by a min runtime): it must list exactly the holders `Exposure.of`
  answers True for, in their order.
- `Growing` (whether a job is exposed at its turn in a pass, on a usage that only grows) keeps
  True answers per that key: `Exposure.of` is monotone in the usage.
- `quota_checks.Checks` answers a queue the check never refuses for its usage once a pass:
  tests/unit/core/test_quota_reclaim_loops.py asks it against `quota_check` as the usage grows.
- the fair-share walk over a flat tree (`ordering._Walk._flat_jobs`) is the general walk.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from corral.core import PendingJob, SchedulerConfig, Snapshot
from corral.core.backlog import Backlog
from corral.core.exposure import Exposure, Growing
from corral.core.ordering import _Walk, by_priority, tree_for
from corral.core.quota import QueueUsage
from tests.unit.core.test_quota_reclaim_loops import SETTINGS, worlds

POLICIES = ["corral", "las", "fair-las", "backfill"]


@SETTINGS
@given(world=worlds(), policy=st.sampled_from(POLICIES), data=st.data())
def test_among_lists_the_holders_of_answers_true_for(world, policy, data) -> None:  # type: ignore[no-untyped-def]
    cluster, queues, pending, run, holding = world
    snap = Snapshot(1000.0, cluster, queues, tuple(pending), tuple(run))
    config = SchedulerConfig.named(policy)
    tree = tree_for(snap, config)
    backlog = Backlog.of(snap, holding)
    usage = QueueUsage.of(tree, snap.running)
    for p in pending:  # some of the waiting jobs counted too, as a pass counts its reservations
        if data.draw(st.booleans()) and tree.known(p.job.queue):
            usage.add(p.job.queue, p.job.total_gpus)
    exposure = Exposure(config, tree, backlog.at, backlog.top)
    jobs = {p.job.id: p.job for p in pending}
    but = {i for i in jobs if data.draw(st.booleans())}
    plain = [i for i, job in jobs.items() if i not in but and exposure.of(job, usage)]
    assert exposure.among(jobs, but, usage) == plain


@SETTINGS
@given(world=worlds(), policy=st.sampled_from(POLICIES), data=st.data())
def test_growing_answers_as_of_does_while_the_usage_grows(world, policy, data) -> None:  # type: ignore[no-untyped-def]
    """A pass asks each job reserved whether it is exposed at its turn, then adds it to the usage
    (`Growing` keeps the True answers per key): the answers are `Exposure.of`'s on the usage as it
    stands at each ask."""
    cluster, queues, pending, run, holding = world
    snap = Snapshot(1000.0, cluster, queues, tuple(pending), tuple(run))
    config = SchedulerConfig.named(policy)
    tree = tree_for(snap, config)
    backlog = Backlog.of(snap, holding)
    usage = QueueUsage.of(tree, snap.running)
    exposure = Exposure(config, tree, backlog.at, backlog.top)
    growing = Growing(exposure, usage)
    for p in pending * 2:
        assert growing(p.job) == exposure.of(p.job, usage)
        if tree.known(p.job.queue) and data.draw(st.booleans()):
            usage.add(p.job.queue, p.job.total_gpus, active=data.draw(st.booleans()))


@SETTINGS
@given(world=worlds(), data=st.data())
def test_the_walk_of_a_flat_tree_is_the_general_walk(world, data) -> None:  # type: ignore[no-untyped-def]
    """`_Walk` over queues that are all children of the root keeps one heap of the queues' offers
    (`_flat_jobs`): the order is the general walk's (forced here by naming a node that is no
    queue as nested), with each queue's jobs by priority or by keys the caller gives."""
    cluster, queues, pending, run, _ = world
    flat = tuple(dataclasses.replace(q, name=q.name.replace("/", "-")) for q in queues)
    jobs = [dataclasses.replace(p, job=dataclasses.replace(p.job, queue=p.job.queue.replace("/", "-")))
            for p in pending]
    snap = Snapshot(1000.0, cluster, flat, tuple(jobs), tuple(run))
    tree = tree_for(snap, SchedulerConfig())
    usage = QueueUsage.of(tree, [r for r in snap.running if tree.known(r.job.queue)])
    by_queue: dict[str, list[PendingJob]] = {}
    for p in by_priority([p for p in jobs if tree.known(p.job.queue)]):
        by_queue.setdefault(p.job.queue, []).append(p)
    keyed = data.draw(st.booleans())
    keys = {q: [(data.draw(st.integers(0, 2)), i) for i, _ in enumerate(js)] for q, js in by_queue.items()}
    for ks in keys.values():
        ks.sort()

    def walk(general: bool) -> list[str]:
        w = _Walk(tree, usage.copy(), {q: list(js) for q, js in by_queue.items()}, None,
                  {q: list(ks) for q, ks in keys.items()} if keyed else None)
        if general:
            w.nested = w.nested | {"no such queue"}
        return [p.job.id for p in w.jobs()]

    assert walk(False) == walk(True)
