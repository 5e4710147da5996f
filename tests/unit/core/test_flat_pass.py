"""A quota pass taken queue by queue (`corral.core.flat_pass`) against the pass that walks the
fair-share order (`reservation._quota_pass`), on trees where it applies: every queue with waiting
jobs a child of the root, none with a ceiling, a per-user ceiling or a lend limit.

The two must reserve the same jobs with the same borrowed GPUs, refuse the same jobs for the same
reasons, find the same jobs exposed (at their turn, and after the pass as `Exposure.among` finds
them on its usage) and leave the same usage; the pass is taken again with more jobs refused, as a
round takes it after a play-out;
whole rounds on such trees must decide as the explained round does (which walks the order).
"""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from corral.core import Cluster, Pending, PendingJob, QueueConfig, Reason, SchedulerConfig, Snapshot
from corral.core import reservation as r
from corral.core.backlog import Backlog, Order
from corral.core.exposure import Exposure
from corral.core.flat_pass import FlatOrder, applies
from corral.core.ordering import tree_for
from corral.core.pipeline import run_round
from corral.core.quota import QueueUsage
from corral.core.quota_checks import Checks
from corral.core.steps import StepMemos
from tests.unit.core.builders import job
from tests.unit.core.test_quota_reclaim_loops import SETTINGS, worlds

CONFIGS = {
    "corral": SchedulerConfig.named("corral"),
    "corral, no reclaim": dataclasses.replace(SchedulerConfig.named("corral"), reclaim=False),
    "fair-las": SchedulerConfig.named("fair-las"),
    "fair-las, promotion leads": dataclasses.replace(SchedulerConfig.named("fair-las"), promotion_arrives=False),
}


def _top(name: str) -> str:
    return name.split("/")[0]


@st.composite
def flat_worlds(draw: st.DrawFn):
    """`worlds()` on its top-level queues alone, none limited (each job moved to its top-level
    queue), the waiting jobs with some attained service (fair-las's levels)."""
    cluster, queues, pending, run, holding = draw(worlds())
    flat = tuple(QueueConfig(q.name, q.guaranteed_gpus, weight=q.weight) for q in queues if "/" not in q.name)

    def moved(job):
        return dataclasses.replace(job, queue=_top(job.queue))

    attained = st.sampled_from([0.0, 100.0, 5000.0, 1e6])
    ran = st.sampled_from([(None, 0.0), (900.0, 10.0), (100.0, 50.0)])  # (requeued at, last run): promotions
    pending = [PendingJob(moved(p.job), draw(attained), requeued_at=(t := draw(ran))[0], last_run_seconds=t[1])
               for p in pending]
    run = [dataclasses.replace(x, job=moved(x.job)) for x in run]
    return cluster, flat, pending, run, holding


@SETTINGS
@given(world=flat_worlds(), policy=st.sampled_from(sorted(CONFIGS)), data=st.data())
def test_the_pass_queue_by_queue_decides_as_the_walk(world, policy, data) -> None:
    cluster, queues, pending, run, holding = world
    snap = Snapshot(1000.0, cluster, queues, tuple(pending), tuple(run))
    config = CONFIGS[policy]
    tree = tree_for(snap, config)
    backlog = Backlog.of(snap, holding)
    order = Order(snap, config, tree, backlog)
    assert applies(order, tree)
    base = QueueUsage.of(tree, snap.running)
    for p in pending:  # some jobs counted already, as a pass counts the holders
        if data.draw(st.booleans()):
            base.add(p.job.queue, p.job.total_gpus, user=p.job.user)
    exposure = Exposure(config, tree, backlog.at, backlog.top)
    flat = FlatOrder(order, exposure, Checks(snap, config, tree, base))  # once a round, for every pass
    refused: dict[str, Reason] = {}
    for _ in range(2):  # a pass, then one with more refused (as after a play-out)
        refused |= {i: r._UNSAID for i in backlog.waiting if data.draw(st.booleans())}
        walked = base.copy()
        out, admitted, exposed, borrowing, tail = r._quota_pass(snap, config, order, walked, exposure, refused,
                                                                False)
        if tail is not None:
            out.extend(r._refusals(tail.order.after(tail.start, snap.pending), tail.refused, tail.check))

        usage = base.copy()
        taken = flat.take(usage, refused)
        decided = r._flat_decisions(flat, taken, order, refused)
        assert sorted(decided, key=lambda d: d.job_id) == sorted(out, key=lambda d: d.job_id)
        queue_of = {i: p.job.queue for i, p in backlog.waiting.items()}
        for q in backlog.by_queue:  # each queue's reservations in its own order, as the walk takes them
            assert [j.id for j in taken.admitted if j.queue == q] == [i for i in admitted if queue_of[i] == q]
        assert taken.borrowing == borrowing
        assert taken.exposed == exposed
        assert (usage.held, usage.active, usage.users) == (walked.held, walked.active, walked.users)


def _passes(pending: list[PendingJob]) -> tuple[tuple[set[str], set[str]], tuple[set[str], set[str]]]:
    """(borrowing, exposed) of one pass over `pending` on two empty 8-GPU nodes, queue `a`
    guaranteed 4 and `b` 12: walked, then queue by queue."""
    snap = Snapshot(1000.0, Cluster.uniform(2, 8, "H100"), (QueueConfig("a", 4), QueueConfig("b", 12)),
                    tuple(pending), ())
    config = SchedulerConfig.named("corral")
    tree = tree_for(snap, config)
    backlog = Backlog.of(snap, set())
    order = Order(snap, config, tree, backlog)
    exposure = Exposure(config, tree, backlog.at, backlog.top)
    _, _, exposed, borrowing, _ = r._quota_pass(snap, config, order, QueueUsage(tree), exposure, {}, False)
    usage = QueueUsage(tree)
    taken = FlatOrder(order, exposure, Checks(snap, config, tree, usage)).take(usage, {})
    return (borrowing, exposed), (taken.borrowing, taken.exposed)


def test_a_queue_exactly_at_its_guarantee_is_not_over_it() -> None:
    a = [PendingJob(job(f"a{i}", 1, 2, "a", submit_time=float(i))) for i in range(3)]
    b = [PendingJob(job("b0", 1, 1, "b"))]
    walked, flat = _passes([*a[:2], *b])  # 4 GPUs of 4: no reclaim can take them back
    assert flat == walked == (set(), set())
    walked, flat = _passes([*a, *b])  # 6 of 4: the third is exposed at its turn, the others after the pass
    assert flat == walked == ({"a2"}, {"a0", "a1", "a2"})


@SETTINGS
@given(world=flat_worlds(), policy=st.sampled_from([*CONFIGS, "las", "backfill"]))
def test_an_unexplained_round_on_a_flat_tree_decides_as_the_explained_one(world, policy) -> None:
    """The whole round: its passes taken queue by queue, the play-outs between them, the Revokes."""
    cluster, queues, pending, run, holding = world
    snap = Snapshot(1000.0, cluster, queues, tuple(pending), tuple(run))
    config = CONFIGS.get(policy) or SchedulerConfig.named(policy)
    told = run_round(snap, config, holding=holding)
    quiet = run_round(snap, config, holding=holding, memos=StepMemos(), explain=False)

    def acts(decisions):
        return sorted(((type(d).__name__, d.job_id, None if isinstance(d, Pending) else d) for d in decisions),
                      key=lambda a: a[1])

    assert (acts(quiet.quota), quiet.placed, quiet.preempts) == (acts(told.quota), told.placed, told.preempts)
