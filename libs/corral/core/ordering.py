"""The order in which a cycle considers pending jobs.

FAIR_SHARE walks the queue tree like Volcano's hierarchical DRF: at every level the child with the
smallest share key (see `quota.share_key`) goes next, then inside the queue the job with the
highest priority, then the oldest. The share is updated as if each job ahead got its GPUs, so
one queue's backlog cannot monopolise the head of the order. FIFO, PRIORITY and LAS are the
baselines the simulator compares against. FAIR_LAS walks the tree the same way and orders each
queue's own jobs by attained-service level (`levels.in_queue_key`).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator
from operator import attrgetter, itemgetter

from corral.core.levels import InQueueKey, in_queue_key, key_at, starvation_limit, thresholds_of
from corral.core.model import OrderPolicy, PendingJob, QueueConfig, SchedulerConfig, Snapshot
from corral.core.quota import ROOT, QueueTree, QueueUsage, share_key

TREE_ORDERS = (OrderPolicy.FAIR_SHARE, OrderPolicy.FAIR_LAS)

#: A queue's in-queue key (`levels.in_queue_key` at a time), or None: priority, then the oldest.
KeyOf = Callable[[PendingJob], InQueueKey] | None


def key_of(config: SchedulerConfig, now: float) -> KeyOf:
    """The in-queue key a cycle at `now` orders each queue by (None: by priority alone)."""
    if config.order is not OrderPolicy.FAIR_LAS or not (thresholds_of(config) or starvation_limit(config) > 0):
        return None
    return key_at(config, now)


def tree_for(snapshot: Snapshot, config: SchedulerConfig) -> QueueTree:
    """The queue tree; without quotas, queues named only by jobs exist implicitly (no limits)."""
    queues: tuple[QueueConfig, ...] = snapshot.queues
    if not config.quotas:
        configured = {q.name for q in queues}
        extra = sorted({p.job.queue for p in snapshot.pending} | {r.job.queue for r in snapshot.running})
        queues = queues + tuple(QueueConfig(n) for n in extra if n not in configured)
    return QueueTree(queues, snapshot.cluster.usable_gpus)


def order_pending(
    snapshot: Snapshot,
    config: SchedulerConfig = SchedulerConfig(),
    *,
    tree: QueueTree | None = None,
    usage: QueueUsage | None = None,
) -> list[PendingJob]:
    """Pending jobs in the order the cycle considers them (deterministic for a given snapshot).

    `tree` and `usage` may be passed when the caller has them for this snapshot (not copied
    back: `usage` is left unchanged)."""
    pending = list(snapshot.pending)
    if config.order is OrderPolicy.FIFO:
        return sorted(pending, key=_BY_SUBMIT)
    if config.order is OrderPolicy.PRIORITY:
        return by_priority(pending)
    if config.order is OrderPolicy.LAS:
        return sorted(pending, key=_BY_ATTAINED)
    return list(iter_pending(snapshot, config, tree=tree, usage=usage))


# C-level sort keys (the order is sorted every cycle, over thousands of jobs in a busy replay)
_BY_SUBMIT = attrgetter("job.submit_time", "job.id")
_BY_ATTAINED = attrgetter("attained_gpu_seconds", "job.submit_time", "job.id")
_PRIORITY = attrgetter("job.priority")
_FIRST = itemgetter(0)


def _LEVEL_ZERO(p: PendingJob) -> InQueueKey:
    return in_queue_key(p, ())


def by_priority(pending: list[PendingJob]) -> list[PendingJob]:
    """Sorted by `levels.in_queue_key` at level 0 (priority first, highest first, then oldest, then id): two
    stable sorts, because a C-level key cannot negate the priority."""
    out = sorted(pending, key=_BY_SUBMIT)
    out.sort(key=_PRIORITY, reverse=True)  # stable, also when reversed
    return out


def iter_pending(
    snapshot: Snapshot,
    config: SchedulerConfig = SchedulerConfig(),
    *,
    tree: QueueTree | None = None,
    usage: QueueUsage | None = None,
) -> Iterator[PendingJob]:
    """`order_pending`, lazily: a cycle that can stop early does not pay for the rest of the order."""
    if config.order not in TREE_ORDERS:
        yield from order_pending(snapshot, config)
        return
    tree = tree if tree is not None else tree_for(snapshot, config)
    usage = usage if usage is not None else QueueUsage.of(tree, snapshot.running)
    yield from _fair_share_order(tree, usage, list(snapshot.pending), key_of(config, snapshot.now))


def _fair_share_order(
    tree: QueueTree, usage: QueueUsage, pending: list[PendingJob], key: KeyOf = None
) -> Iterator[PendingJob]:
    """Walk the tree from the root, at every level taking the candidate with the smallest
    (share key, best job key, name) -- a child subtree that has waiting jobs, or the node's own
    jobs -- then charge the job's GPUs to its queue and repeat.

    Each tree node keeps a heap of its candidates with lazily discarded stale entries: taking a
    job changes only the keys on its queue's path to the root, so one step costs
    O(depth x log(children)) instead of a scan of every sibling (a Philly cycle orders ~1,000
    jobs over 12 queues; the scan made ordering the most expensive part of the cycle).
    """
    by_queue: dict[str, list[PendingJob]] = {}
    for p in pending:
        by_queue.setdefault(p.job.queue, []).append(p)
    unknown = sorted((p for q in list(by_queue) if not tree.known(q) for p in by_queue.pop(q)), key=_BY_SUBMIT)
    if key is None:
        yield from fair_share_walk(tree, usage, {q: by_priority(js) for q, js in by_queue.items()}, unknown)
        return
    # each job's key once: the sort's, kept for the walk (which reads every queue head's key again)
    keyed = {q: sorted([(key(p), p) for p in js], key=_FIRST) for q, js in by_queue.items()}
    walk = _Walk(tree, usage.copy(), {q: [p for _, p in kp] for q, kp in keyed.items()}, key,
                 {q: [k for k, _ in kp] for q, kp in keyed.items()})
    yield from walk.jobs()
    yield from unknown


def fair_share_walk(
    tree: QueueTree,
    usage: QueueUsage,
    sorted_by_queue: dict[str, list[PendingJob]],
    unknown: list[PendingJob],
    key: KeyOf = None,
) -> Iterator[PendingJob]:
    """`_fair_share_order` from each known queue's jobs already in `key` order (and
    the jobs of unknown queues, last, in submit order): the part a `SchedulerState` cannot keep,
    because the shares move with every job taken. `usage` is not changed."""
    walk = _Walk(tree, usage.copy(), sorted_by_queue, key)
    yield from walk.jobs()
    yield from unknown


_Offer = tuple[tuple[int, float], InQueueKey, str]


class _Walk:
    """The state of one `fair_share_walk`: per tree node a heap of offers (share key, best job key
    in the candidate's subtree, name) from its children with waiting jobs and from its own jobs,
    and the current offer of each (owner, candidate), against which heap entries are checked.

    A class rather than closures inside the generator: `refresh` runs for every ancestor of every
    job taken (~12 % of a Corral cycle), and a queue whose subtree has no other waiting queue
    (every leaf) skips the list of keys and its own heap -- it is its only candidate."""

    __slots__ = ("best", "current", "head_keys", "heads", "heaps", "key", "nested", "tree", "usage", "waiting")

    def __init__(
        self,
        tree: QueueTree,
        usage: QueueUsage,
        sorted_by_queue: dict[str, list[PendingJob]],
        key: KeyOf,
        keys: dict[str, list[InQueueKey]] | None = None,
    ) -> None:
        self.tree, self.usage = tree, usage
        self.key: Callable[[PendingJob], InQueueKey] = key if key is not None else _LEVEL_ZERO
        self.heads: dict[str, deque[PendingJob]] = {q: deque(js) for q, js in sorted_by_queue.items() if js}
        #: each head's jobs' keys, in step with `heads`, when the caller has them (`key` is asked otherwise)
        self.head_keys: dict[str, deque[InQueueKey]] | None = (
            None if keys is None else {q: deque(keys[q]) for q in self.heads})
        self.waiting: dict[str, int] = {}
        for q, js in self.heads.items():
            for a in tree.path(q):
                self.waiting[a] = self.waiting.get(a, 0) + len(js)
        # nodes with a waiting child: their own jobs compete with their children's offers
        self.nested = {tree.parent(q) for q in self.waiting}
        self.heaps: dict[str, list[tuple[_Offer, str]]] = {}
        self.current: dict[tuple[str, str], _Offer] = {}
        self.best: dict[str, InQueueKey] = {}  # best job key in a subtree with waiting jobs

    def jobs(self) -> Iterator[PendingJob]:
        if self.nested <= {ROOT}:
            yield from self._flat_jobs()
            return
        tree, usage, heads, waiting = self.tree, self.usage, self.heads, self.waiting
        for q in sorted(waiting, key=lambda n: -n.count("/")):  # leaves before their ancestors
            self.refresh(q)
        remaining = sum(len(js) for js in heads.values())
        while remaining:
            node = self.descend()
            p = heads[node].popleft()
            if self.head_keys is not None:
                self.head_keys[node].popleft()
            yield p
            remaining -= 1
            usage.add(node, p.job.total_gpus)
            path = tree.path(node)
            for a in path:
                waiting[a] -= 1
            for a in path:
                self.refresh(a)

    def _flat_jobs(self) -> Iterator[PendingJob]:
        """`jobs` when every queue with waiting jobs is a child of the root: taking a job changes
        only its own queue's offer (its share key reads its own usage), so one heap of the
        queues' offers, each pushed again after its queue's turn, is the walk."""
        tree, usage, heads, keys = self.tree, self.usage, self.heads, self.head_keys
        key = self.key
        heap = [(share_key(tree, usage, q), keys[q][0] if keys is not None else key(js[0]), q)
                for q, js in heads.items()]
        heapq.heapify(heap)
        while heap:
            q = heapq.heappop(heap)[2]
            own = heads[q]
            p = own.popleft()
            if keys is not None:
                keys[q].popleft()
            yield p
            usage.add(q, p.job.total_gpus)
            if own:
                heapq.heappush(heap, (share_key(tree, usage, q), keys[q][0] if keys is not None else key(own[0]), q))

    def offer(self, owner: str, cand: str, key: _Offer) -> None:
        if self.current.get((owner, cand)) != key:
            self.current[(owner, cand)] = key
            heap = self.heaps.get(owner)
            if heap is None:
                heap = self.heaps[owner] = []
            heapq.heappush(heap, (key, cand))

    def refresh(self, q: str) -> None:
        """Recompute q's own entry, its best job key and its entry in its parent's heap."""
        own = self.heads.get(q)
        tree = self.tree
        share = share_key(tree, self.usage, q)
        if not own:
            mine = None
        elif self.head_keys is not None:
            mine = self.head_keys[q][0]
        else:
            mine = self.key(own[0])
        nested = q in self.nested
        if nested:
            if mine is not None:
                self.offer(q, q, (share, mine, q))
            else:
                self.current.pop((q, q), None)
        parent = tree.parent(q)
        if self.waiting.get(q, 0) > 0:
            if nested:
                keys = [mine] if mine is not None else []
                keys.extend(self.best[c] for c in tree.children.get(q, ()) if self.waiting.get(c, 0) > 0)
                best = self.best[q] = min(keys)
            else:
                assert mine is not None
                best = self.best[q] = mine
            self.offer(parent, q, (share, best, q))
        else:
            self.best.pop(q, None)
            self.current.pop((parent, q), None)

    def descend(self) -> str:
        """From the root, follow each level's best current offer down to the queue whose job is next."""
        node = ROOT
        heaps, current, nested = self.heaps, self.current, self.nested
        while True:
            if node != ROOT and node not in nested:
                return node  # no waiting child: its own jobs are its only candidate
            heap = heaps[node]
            while current.get((node, heap[0][1])) != heap[0][0]:
                heapq.heappop(heap)  # stale: the candidate's key changed or it has no jobs left
            choice = heap[0][1]
            if choice == node:
                return node
            node = choice
