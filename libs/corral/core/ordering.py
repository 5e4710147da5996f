"""The order in which a cycle considers pending jobs.

FAIR_SHARE walks the queue tree like Volcano's hierarchical DRF: at every level the child with the
smallest share key (see `quota.share_key`) goes next, then inside the queue the job with the
highest priority, then the oldest. The share is updated as if each job ahead got its GPUs, so
one queue's backlog cannot monopolise the head of the order. FIFO, PRIORITY and LAS are the
baselines the simulator compares against.
"""

from __future__ import annotations

from collections import deque

from corral.core.model import OrderPolicy, PendingJob, QueueConfig, SchedulerConfig, Snapshot
from corral.core.quota import ROOT, QueueTree, QueueUsage, share_key


def _in_queue_key(p: PendingJob) -> tuple[int, float, str]:
    return (-p.job.priority, p.job.submit_time, p.job.id)


def tree_for(snapshot: Snapshot, config: SchedulerConfig) -> QueueTree:
    """The queue tree; without quotas, queues named only by jobs exist implicitly (no limits)."""
    queues: tuple[QueueConfig, ...] = snapshot.queues
    if not config.quotas:
        configured = {q.name for q in queues}
        extra = sorted({p.job.queue for p in snapshot.pending} | {r.job.queue for r in snapshot.running})
        queues = queues + tuple(QueueConfig(n) for n in extra if n not in configured)
    return QueueTree(queues, snapshot.cluster.usable_gpus)


def order_pending(
    snapshot: Snapshot, config: SchedulerConfig = SchedulerConfig(), *, tree: QueueTree | None = None
) -> list[PendingJob]:
    """Pending jobs in the order the cycle considers them (deterministic for a given snapshot)."""
    pending = list(snapshot.pending)
    if config.order is OrderPolicy.FIFO:
        return sorted(pending, key=lambda p: (p.job.submit_time, p.job.id))
    if config.order is OrderPolicy.PRIORITY:
        return sorted(pending, key=_in_queue_key)
    if config.order is OrderPolicy.LAS:
        return sorted(pending, key=lambda p: (p.attained_gpu_seconds, p.job.submit_time, p.job.id))
    tree = tree if tree is not None else tree_for(snapshot, config)
    return _fair_share_order(tree, QueueUsage.of(tree, snapshot.running), pending)


def _fair_share_order(tree: QueueTree, usage: QueueUsage, pending: list[PendingJob]) -> list[PendingJob]:
    usage = usage.copy()
    unknown = sorted((p for p in pending if not tree.known(p.job.queue)), key=lambda p: (p.job.submit_time, p.job.id))
    by_queue: dict[str, list[PendingJob]] = {}
    for p in pending:
        if tree.known(p.job.queue):
            by_queue.setdefault(p.job.queue, []).append(p)
    heads: dict[str, deque[PendingJob]] = {q: deque(sorted(js, key=_in_queue_key)) for q, js in by_queue.items()}
    waiting: dict[str, int] = {}
    for q, js in heads.items():
        for a in tree.path(q):
            waiting[a] = waiting.get(a, 0) + len(js)
    out: list[PendingJob] = []
    remaining = sum(len(js) for js in heads.values())
    while remaining:
        node = ROOT
        while True:
            best: tuple[tuple[int, float], tuple[int, float, str], str] | None = None
            choice: str | None = None
            own = heads.get(node)
            if own:
                best = (share_key(tree, usage, node), _in_queue_key(own[0]), node)
                choice = node
            for c in tree.children[node]:
                if waiting.get(c, 0) > 0:
                    key = (share_key(tree, usage, c), _in_queue_key(_head(heads, tree, c)), c)
                    if best is None or key < best:
                        best, choice = key, c
            assert choice is not None
            if choice == node:
                break
            node = choice
        p = heads[node].popleft()
        out.append(p)
        remaining -= 1
        usage.add(node, p.job.total_gpus)
        for a in tree.path(node):
            waiting[a] -= 1
    return out + unknown


def _head(heads: dict[str, deque[PendingJob]], tree: QueueTree, queue: str) -> PendingJob:
    """The best job waiting anywhere in `queue`'s subtree (used only to break share ties)."""
    best: PendingJob | None = None
    stack = [queue]
    while stack:
        q = stack.pop()
        h = heads.get(q)
        if h and (best is None or _in_queue_key(h[0]) < _in_queue_key(best)):
            best = h[0]
        stack.extend(tree.children.get(q, ()))
    assert best is not None
    return best
