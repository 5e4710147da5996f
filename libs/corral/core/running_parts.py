"""RunningParts: what a cycle derives from the cluster and the running jobs alone, kept by the caller.

Why: a caller that asks several steps in a row about one state (the quota step plays placement and
preemption out, then placement and preemption decide: `corral.core.pipeline`) passes the same
`Snapshot.running` tuple to each, and from one round to the next only a job or two of that tuple
changes. Deriving the free-GPU index, the backfill releases, the running index and the queue tree
from scratch for each ask was most of such a round. The parts live in the caller's `ClassMemo`
(`running`): found again by the tuple's identity (the memo keeps the tuple alive), or moved to a
new tuple by the jobs that differ from the last one's (by identity: a RunningJob is immutable, so
an object in both tuples is the same job with the same facts). `prepared.prepare` hands each cycle
copies of what the cycle changes (`fi`, `releasing`, `usage`); the rest it only reads. Every part
equals what `prepare` derives from scratch (tests/unit/core/test_running_parts.py).
"""

from __future__ import annotations

import math
from operator import attrgetter

from corral.core.backfill import Release
from corral.core.gpuset import ClusterIndex, FreeGpus
from corral.core.ledger import add_masks
from corral.core.model import Cluster, NodeState, QueueConfig, RunningJob, SchedulerConfig, Snapshot
from corral.core.ordering import tree_for
from corral.core.quota import QueueTree, QueueUsage
from corral.core.running import RunningIndex
from corral.core.shortcuts import ClassMemo

_BY_ID = attrgetter("job.id")
_READY = frozenset({NodeState.READY})


class RunningParts:
    """The parts of one tuple of running jobs on one cluster (see the module docstring)."""

    __slots__ = ("_grown", "_releases", "_trees", "_usages", "by_id", "cluster", "fi", "kept", "queues", "releasing",
                 "running", "used")

    def __init__(self, cluster: Cluster, running: tuple[RunningJob, ...]) -> None:
        self.cluster, self.running = cluster, running
        index = ClusterIndex.of(cluster, _READY)
        self.used: dict[int, int] = {}
        for r in running:
            add_masks(self.used, index.held_masks(r, self.used))  # checked: a GPU has one holder
        self.by_id = {r.job.id: r for r in running}
        self.kept = RunningIndex()  # sorted by id: `Prepared.running` is its `jobs`
        for r in sorted(running, key=_BY_ID):
            self.kept.add(r)
        self._releases: dict[str, Release] | None = None  # built on first use (backfill only)
        self._trees: dict[tuple[bool, frozenset[str] | None], tuple[tuple[QueueConfig, ...], QueueTree]] = {}
        self._grown: RunningParts | None = None  # the last parts of these jobs and a few more (`grown`)
        self._finish()

    def _finish(self) -> None:
        """The parts read off `used` and the jobs: the free-GPU index, releasing GPUs, queue names."""
        self.fi = FreeGpus(self.cluster, used=self.used)
        self.releasing: dict[int, int] = {}
        for r in self.kept.jobs:
            if r.preempting:
                add_masks(self.releasing, self.fi.masks_of(r.placement))
        self.queues = frozenset(r.job.queue for r in self.running)
        self._usages: dict[int, tuple[QueueTree, QueueUsage]] = {}  # by the tree's identity

    @classmethod
    def of(cls, snapshot: Snapshot, memo: ClassMemo) -> RunningParts:
        """The parts of `snapshot.running`: the memo's (or the last grown from them, `grown`), as
        they are or moved to this tuple."""
        found = memo.running
        if isinstance(found, RunningParts) and found.cluster is snapshot.cluster:
            if found.running is snapshot.running:
                return found
            grown = found._grown
            if grown is not None and grown.running is snapshot.running:
                return grown
            if found._move_to(snapshot.running):
                return found
        made = cls(snapshot.cluster, snapshot.running)
        memo.running = made
        return made

    def grown(self, running: tuple[RunningJob, ...]) -> RunningParts | None:
        """The parts of `running` when it is these jobs followed by a few more (the state once
        jobs start: `steps.after_placing`), derived from these, which stay as they are (the memo
        keeps them for the tuple it is asked about again); None when `running` is not such a
        tuple. The memo finds the last grown parts again by their tuple's identity (`of`)."""
        n = len(self.running)
        if len(running) <= n or running[:n] != self.running:
            return None
        last = self._grown
        if last is not None and last.running is running:
            return last
        extra = running[n:]
        by_id = dict(self.by_id)
        for r in extra:
            if by_id.setdefault(r.job.id, r) is not r:
                return None  # an id twice: the move (or `prepare`) says so
        index = ClusterIndex.of(self.cluster, _READY)
        used, fi, releasing = dict(self.used), self.fi.copy(), dict(self.releasing)
        kept = self.kept.copy()
        for r in extra:
            masks = index.held_masks(r, used)  # checked: a GPU has one holder
            add_masks(used, masks)
            for i, m in masks:
                fi.take(i, m & fi.usable_masks[i])  # a GPU out of service is never free
            if r.preempting:
                add_masks(releasing, masks)
            kept.add(r)
        out = RunningParts.__new__(RunningParts)
        out.cluster, out.running, out.by_id, out.used, out.kept, out.fi = self.cluster, running, by_id, used, kept, fi
        out.releasing, out._trees, out._grown = releasing, self._trees, None
        out.queues = self.queues.union(r.job.queue for r in extra)
        out._releases = None if self._releases is None else {**self._releases, **_releases(list(extra), index)}
        out._usages = {} if any(r.preempting for r in extra) else {
            k: (tree, _with(usage, extra)) for k, (tree, usage) in self._usages.items()}
        self._grown = out
        return out

    def _move_to(self, running: tuple[RunningJob, ...]) -> bool:
        """These parts become `running`'s; False (unchanged) when most jobs differ (rebuild then)."""
        old = self.by_id
        new = {r.job.id: r for r in running}
        gone = [r for i, r in old.items() if new.get(i) is not r]
        came = [r for i, r in new.items() if old.get(i) is not r]
        if len(new) != len(running) or 2 * (len(gone) + len(came)) > len(running) + 1:
            return False
        index = ClusterIndex.of(self.cluster, _READY)
        used = dict(self.used)
        for r in gone:
            for i, m in index.masks_of(r.placement):
                left = used[i] & ~m
                if left:
                    used[i] = left
                else:
                    del used[i]
        for r in came:
            add_masks(used, index.held_masks(r, used))  # checked (a GPU has one holder) before any change
        for r in gone:
            self.kept.remove(r)
        for r in came:
            self.kept.add(r)
        if self._releases is not None:
            releases = dict(self._releases)
            for r in gone:
                releases.pop(r.job.id, None)
            releases.update(_releases(came, index))
            self._releases = releases
        self.running, self.by_id, self.used, self._grown = running, new, used, None
        self._finish()
        return True

    def tree(self, snapshot: Snapshot, config: SchedulerConfig) -> QueueTree:
        """`ordering.tree_for(snapshot, config)`."""
        key = (config.quotas, None if config.quotas else frozenset(p.job.queue for p in snapshot.pending) | self.queues)
        hit = self._trees.get(key)
        if hit is None or hit[0] is not snapshot.queues:
            hit = self._trees[key] = (snapshot.queues, tree_for(snapshot, config))
        return hit[1]

    def usage(self, tree: QueueTree) -> QueueUsage:
        """A fresh copy of the running jobs' usage of `tree`."""
        hit = self._usages.get(id(tree))
        if hit is None or hit[0] is not tree:
            hit = self._usages[id(tree)] = (tree, QueueUsage.of(tree, self.running))
        return hit[1].copy()

    def releases(self) -> dict[str, Release]:
        """When each running job not asked to checkpoint gives its GPUs back (backfill), by id."""
        if self._releases is None:
            self._releases = _releases(self.kept.jobs, ClusterIndex.of(self.cluster, _READY))
        return self._releases


def _with(usage: QueueUsage, extra: tuple[RunningJob, ...]) -> QueueUsage:
    """A copy of `usage` with the jobs of `extra` (none asked to checkpoint) held too."""
    out = usage.copy()
    for r in extra:
        out.add(r.job.queue, r.placement.gpu_count, user=r.job.user)
    return out


def _releases(running: list[RunningJob], index: ClusterIndex) -> dict[str, Release]:
    out: dict[str, Release] = {}
    for r in running:
        if not r.preempting:
            end = r.expected_end()
            out[r.job.id] = Release(math.inf if end is None else end, r.job.id, index.masks_of(r.placement))
    return out
