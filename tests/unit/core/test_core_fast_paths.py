"""The cycle's fast paths decide exactly what the plain definitions decide.

Why: to replay a 52,849-job trace quickly, the core orders pending jobs with per-level heaps and
answers every job of an already-decided class from a cache (see `cycle.Cycle.decide` and `shortcuts`). These
properties drive the same random clusters, queue trees and job streams as the invariant tests and
compare, on every cycle, the fast answer with the plain one: the fair-share order against a
straightforward walk of the tree, the decisions against a cycle that decides every job in full,
and `schedule(explain=False)` (which stops early) against the actions of the full cycle.
"""

from __future__ import annotations

from collections import deque

from hypothesis import given
from hypothesis import strategies as st

from corral.core import Pending, PendingJob, SchedulerConfig, Snapshot, schedule
from corral.core.cycle import Cycle
from corral.core.ordering import order_pending, tree_for
from corral.core.quota import ROOT, QueueTree, QueueUsage, share_key

from .test_core_properties import POLICIES, SETTINGS, clusters, named, queue_trees, simulate


def _in_queue_key(p: PendingJob) -> tuple[int, float, str]:
    return (-p.job.priority, p.job.submit_time, p.job.id)


def reference_fair_share_order(tree: QueueTree, usage: QueueUsage, pending: list[PendingJob]) -> list[PendingJob]:
    """The definition: from the root, take the child (or the node's own jobs) with the smallest
    (share key, best waiting job, name), descend, take that queue's first job, charge its GPUs."""
    usage = usage.copy()
    unknown = sorted((p for p in pending if not tree.known(p.job.queue)), key=lambda p: (p.job.submit_time, p.job.id))
    heads: dict[str, deque[PendingJob]] = {}
    for p in sorted((p for p in pending if tree.known(p.job.queue)), key=_in_queue_key):
        heads.setdefault(p.job.queue, deque()).append(p)

    def subtree_best(q: str) -> tuple[int, float, str] | None:
        keys = [_in_queue_key(h[0]) for name, h in heads.items() if h and (name == q or name.startswith(q + "/"))]
        return min(keys) if keys else None

    out: list[PendingJob] = []
    while any(heads.values()):
        node = ROOT
        while True:
            options = []
            if heads.get(node):
                options.append((share_key(tree, usage, node), _in_queue_key(heads[node][0]), node))
            for c in tree.children[node]:
                b = subtree_best(c)
                if b is not None:
                    options.append((share_key(tree, usage, c), b, c))
            choice = min(options)[2]
            if choice == node:
                break
            node = choice
        p = heads[node].popleft()
        out.append(p)
        usage.add(node, p.job.total_gpus)
    return out + unknown


class _PlainCycle(Cycle):
    """The cycle with the per-class answers switched off: every job decided in full."""

    def class_of(self, p: PendingJob) -> None:
        return None


def _same_order(snap: Snapshot, config: SchedulerConfig, decisions: object) -> None:
    tree = tree_for(snap, config)
    usage = QueueUsage.of(tree, snap.running)
    fast = [p.job.id for p in order_pending(snap, SchedulerConfig(), tree=tree)]
    plain = [p.job.id for p in reference_fair_share_order(tree, usage, list(snap.pending))]
    assert fast == plain


def _same_decisions(snap: Snapshot, config: SchedulerConfig, decisions: list[object]) -> None:
    assert decisions == _PlainCycle.of(snap, config).run()
    assert schedule(snap, config, explain=False) == [d for d in decisions if not isinstance(d, Pending)]


@SETTINGS
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_fair_share_order_is_the_tree_walk_of_its_definition(data, seed):
    cluster = data.draw(clusters())
    queues = data.draw(queue_trees(max(cluster.usable_gpus, 1)))
    simulate(cluster, queues, SchedulerConfig(), seed, cycles=12, simple=False, check=_same_order)


@SETTINGS
@given(data=st.data(), policy=st.sampled_from(POLICIES), seed=st.integers(0, 2**16))
def test_class_answers_and_the_actions_only_cycle_decide_what_deciding_every_job_does(data, policy, seed):
    cluster = data.draw(clusters())
    queues = data.draw(queue_trees(max(cluster.usable_gpus, 1)))
    simulate(cluster, queues, named(policy), seed, cycles=12, simple=False, check=_same_decisions)

