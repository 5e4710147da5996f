"""SchedulerState: the scheduling state its owner keeps between cycles, so a cycle starts ready.

Why: `schedule(snapshot)` pays O(running + waiting) before it decides anything: the free-GPU index
from every placement, usage per queue, the queue tree, the whole order of the waiting jobs, the
job classes. A Philly replay runs ~100,000 cycles with one or two jobs changed between two of
them, and that rebuilding was half of its time. Like Kueue's cache and queue manager, the owner
(the simulator's engine) tells the state what happened -- a job arrived, started, was asked to
checkpoint, ended; a node came or went -- and each change updates the derived parts in
O(log n) or O(nodes it touches). `cycle(now)` then hands them to the same `Cycle` as a
`Prepared` (the input `prepared.prepare(snapshot)` builds from scratch) and decides exactly what
`schedule(state.snapshot(now), config)` decides (tests/unit/core/test_scheduler_state.py drives
both with random changes and compares).

Pure like the rest of the core: no clock, no I/O; time is `cycle`'s argument. The order of the
jobs added is remembered, so `snapshot()` lists them as the owner's own dicts would.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Iterator, Sequence
from operator import attrgetter
from typing import TypeVar

from corral.core.backfill import Release
from corral.core.cycle import Cycle
from corral.core.decisions import Decision
from corral.core.gpuset import ClusterIndex, FreeGpus
from corral.core.ledger import add_masks
from corral.core.levels import InQueueKey, in_queue_key, service_read, starvation_limit, thresholds_of
from corral.core.model import (
    Cluster,
    NodeState,
    OrderPolicy,
    PendingJob,
    QueueConfig,
    RunningJob,
    SchedulerConfig,
    Snapshot,
)
from corral.core.ordering import TREE_ORDERS, fair_share_walk, key_of
from corral.core.preemption.eligibility import NONE_SPARED, spared
from corral.core.prepared import Prepared
from corral.core.quota import QueueTree, QueueUsage
from corral.core.running import RunningIndex
from corral.core.shortcuts import class_key
from corral.core.starvation import Promotions

_BY_SUBMIT = attrgetter("job.submit_time", "job.id")
_READY = frozenset({NodeState.READY})

_OrderKey = tuple[float, float, float, str]


class _SortedJobs:
    """Pending jobs kept sorted by a unique key (two parallel lists: bisect needs the keys alone)."""

    __slots__ = ("jobs", "keys")

    def __init__(self) -> None:
        self.keys: list[_OrderKey] = []
        self.jobs: list[PendingJob] = []

    def add(self, key: _OrderKey, p: PendingJob) -> None:
        i = bisect_left(self.keys, key)
        self.keys.insert(i, key)
        self.jobs.insert(i, p)

    def remove(self, key: _OrderKey) -> None:
        i = bisect_left(self.keys, key)
        assert self.keys[i] == key
        del self.keys[i]
        del self.jobs[i]


class SchedulerState:
    """Pending and running jobs of one cluster under one config, with what a cycle derives from
    them kept current. Ids are unique across pending and running (a ValueError otherwise)."""

    def __init__(self, cluster: Cluster, queues: Sequence[QueueConfig], config: SchedulerConfig) -> None:
        self.config = config
        self._thresholds = thresholds_of(config)
        self._read = service_read(config)  # what of a job's attained service its class reads
        self._resets = config.promotion_resets_level  # a promoted job's class differs (`levels.resets_at`)
        self._promotions = Promotions(starvation_limit(config))  # re-keyed as each cycle's time moves
        self._arrives = config.promotion_arrives  # a promoted job's key reads its promotion time
        self._key = None if key_of(config, 0.0) is None else self._in_queue  # the walk's in-queue key
        self.queues = tuple(queues)
        self._configured = {q.name for q in self.queues}
        self._pending: dict[str, PendingJob] = {}
        self._running: dict[str, RunningJob] = {}
        self._run_index = RunningIndex()  # sorted by id; priorities; attained service
        # classes (`shortcuts.class_key`) with waiting jobs, numbered here (a number is never reused;
        # a class is forgotten once empty: a job's spared set and promotion move it from key to key)
        self._class_ids: dict[tuple[object, ...], int] = {}
        self._class_keys: dict[int, tuple[object, ...]] = {}  # the inverse, to forget an empty class
        self._next_class = 0
        self._by_user = any(q.max_gpus_per_user is not None for q in self.queues)  # (`class_key`)
        self._class: dict[str, int] = {}
        self._members: dict[int, dict[str, PendingJob]] = {}
        self._seq: dict[str, int] = {}  # pending job -> when it was added (its place in the snapshot)
        self._firsts: list[tuple[int, int]] = []  # (seq of its first job, class), sorted
        self._next_seq = 0
        # the order: one sorted list, or one per queue for fair share
        self._order = _SortedJobs()
        self._per_queue: dict[str, _SortedJobs] = {}
        # running jobs: GPUs per node, usage per leaf queue, who is leaving, who preempted whom
        self._masks: dict[str, tuple[tuple[int, int], ...]] = {}
        self._used: dict[int, int] = {}
        self._held: dict[str, int] = {}
        self._held_users: dict[tuple[str, str], int] = {}  # (user, leaf queue) -> GPUs held
        self._leaving: dict[str, int] = {}
        self._preempting: set[str] = set()
        # who preempted whom, as much as the classes read (`eligibility.spared`): a waiting job's
        # spared set changes when a job it names, or one naming it, starts or ends
        self._victims_of: dict[str, dict[str, None]] = {}  # preemptor -> running jobs it preempted
        self._hit_by: dict[str, set[str]] = {}  # job id -> waiting jobs whose preempted_by names it
        self._spared: dict[str, frozenset[str]] = {}  # waiting job -> its spared set, when not empty
        self._restate: set[str] = set()  # waiting jobs whose spared set may have changed
        self._releases: dict[str, Release] = {}  # backfill: when each running job's GPUs come back
        # queue names jobs use (without quotas, a queue named only by jobs exists implicitly)
        self._named: dict[str, int] = {}
        self._tree: QueueTree | None = None
        self.cluster = cluster
        self._index = ClusterIndex.of(cluster, _READY)
        self._fi = FreeGpus(cluster, _READY)  # kept current: each cycle gets a copy

    # -- changes --------------------------------------------------------------------------------
    def set_cluster(self, cluster: Cluster) -> None:
        """Nodes changed (a node lost, drained or back): every running job's GPUs are re-indexed."""
        self.cluster = cluster
        self._index = ClusterIndex.of(cluster, _READY)
        self._tree = None
        self._used = {}
        for job_id, r in self._running.items():
            masks = self._masks[job_id] = self._index.held_masks(r, self._used)
            add_masks(self._used, masks)
            if job_id in self._releases:
                self._releases[job_id] = self._releases[job_id]._replace(masks=masks)
        self._fi = FreeGpus(cluster, _READY, used=self._used)

    def add_pending(self, p: PendingJob) -> None:
        job_id = p.job.id
        if job_id in self._pending or job_id in self._running:
            raise ValueError(f"job {job_id!r} is already pending or running; job ids must be unique")
        self._pending[job_id] = p
        self._seq[job_id] = self._next_seq
        self._next_seq += 1
        for x in p.preempted_by:
            self._hit_by.setdefault(x, set()).add(job_id)
        found = spared(p, self._running, self._victims_of)
        if found:
            self._spared[job_id] = found
        self._promotions.add(p)
        self._join(job_id, p, self._class_id(p, found))
        self._sorted_for(p).add(self._order_key(p), p)
        self._name(p.job.queue, +1)

    def remove_pending(self, job_id: str) -> PendingJob:
        p = self._pending.pop(job_id)
        self._leave(job_id)
        self._seq.pop(job_id)
        self._spared.pop(job_id, None)
        for x in p.preempted_by:
            hit = self._hit_by[x]
            hit.discard(job_id)
            if not hit:
                del self._hit_by[x]
        self._sorted_for(p).remove(self._order_key(p))
        self._promotions.remove(job_id)
        self._name(p.job.queue, -1)
        return p

    def _class_id(self, p: PendingJob, found: frozenset[str]) -> int:
        key = class_key(p, self._by_user, self._read, found, self._resets and p.job.id in self._promotions.promoted)
        k = self._class_ids.get(key)
        if k is None:
            k = self._class_ids[key] = self._next_class
            self._class_keys[k] = key
            self._next_class += 1
        return k

    def _join(self, job_id: str, p: PendingJob, k: int) -> None:
        """Put a waiting job in class `k`; a class's members stay in the order they were added."""
        self._class[job_id] = k
        seq = self._seq[job_id]
        members = self._members.get(k)
        if members is None:
            self._members[k] = {job_id: p}
            insort(self._firsts, (seq, k))
            return
        first, last = next(iter(members)), next(reversed(members))
        members[job_id] = p
        if self._seq[last] > seq:  # a job added earlier joins (its spared set changed): re-sorted
            self._members[k] = dict(sorted(members.items(), key=lambda m: self._seq[m[0]]))
            if self._seq[first] > seq:
                del self._firsts[bisect_left(self._firsts, (self._seq[first], k))]
                insort(self._firsts, (seq, k))

    def _leave(self, job_id: str) -> None:
        k = self._class.pop(job_id)
        members = self._members[k]
        first = next(iter(members)) == job_id
        del members[job_id]
        if first:  # the class's place in the order of first jobs moves (or it is gone)
            firsts = self._firsts
            del firsts[bisect_left(firsts, (self._seq[job_id], k))]
            if members:
                insort(firsts, (self._seq[next(iter(members))], k))
        if not members:
            del self._members[k]
            del self._class_ids[self._class_keys.pop(k)]

    def _restate_spared(self) -> None:
        """Re-class the waiting jobs whose spared set may have changed (a job they name, or one
        naming them, started or ended)."""
        for job_id in sorted(self._restate):
            p = self._pending.get(job_id)
            if p is None:
                continue
            found = spared(p, self._running, self._victims_of)
            if found == self._spared.get(job_id, NONE_SPARED):
                continue
            if found:
                self._spared[job_id] = found
            else:
                del self._spared[job_id]
            self._leave(job_id)
            self._join(job_id, p, self._class_id(p, found))
        self._restate.clear()

    def add_running(self, r: RunningJob) -> None:
        job_id = r.job.id
        if job_id in self._pending or job_id in self._running:
            raise ValueError(f"job {job_id!r} is already pending or running; job ids must be unique")
        masks = self._index.held_masks(r, self._used)
        self._running[job_id] = r
        self._run_index.add(r)
        self._masks[job_id] = masks
        add_masks(self._used, masks)
        for i, m in masks:
            self._fi.take(i, m & self._fi.usable_masks[i])  # a GPU out of service is never free
        self._count(r, +1)
        self._name(r.job.queue, +1)
        self._ran(job_id)

    def remove_running(self, job_id: str) -> RunningJob:
        r = self._running.pop(job_id)
        self._run_index.remove(r)
        for i, m in self._masks.pop(job_id):
            self._fi.give(i, m)
            left = self._used[i] & ~m
            if left:
                self._used[i] = left
            else:
                del self._used[i]
        self._count(r, -1)
        self._name(r.job.queue, -1)
        self._ran(job_id)
        return r

    def _ran(self, job_id: str) -> None:
        """A job started or ended: the waiting jobs it preempted may preempt it, or not, now."""
        hit = self._hit_by.get(job_id)
        if hit:
            self._restate.update(hit)
        if self._restate:
            self._restate_spared()

    def replace_running(self, r: RunningJob) -> None:
        """The same running job (same id and placement) with new facts: asked to checkpoint, a
        checkpoint taken, more attained service."""
        old = self._running[r.job.id]
        if (r.placement is not old.placement and r.placement != old.placement) or r.job.queue != old.job.queue:
            raise ValueError(f"job {r.job.id!r}: replace_running keeps the placement; remove and add it")
        self._running[r.job.id] = r
        self._run_index.replace(old, r)
        if r.job is old.job and (r.preempting, r.preempted_by, r.start_time) == (
            old.preempting, old.preempted_by, old.start_time
        ):
            return  # a checkpoint taken, more service: nothing `_count` keeps changes
        self._count(old, -1)
        self._count(r, +1)
        if self._restate:
            self._restate_spared()

    def _count(self, r: RunningJob, sign: int) -> None:
        if sign < 0:
            self._releases.pop(r.job.id, None)
        elif not r.preempting:
            end = r.expected_end()
            self._releases[r.job.id] = Release(math.inf if end is None else end, r.job.id, self._masks[r.job.id])
        q, g = r.job.queue, r.placement.gpu_count * sign
        _bump(self._held, q, g)
        if r.job.user is not None:
            _bump(self._held_users, (r.job.user, q), g)
        if r.preempting:
            _bump(self._leaving, q, g)
            if sign > 0:
                self._preempting.add(r.job.id)
            else:
                self._preempting.discard(r.job.id)
        for x in r.preempted_by:
            victims = self._victims_of.setdefault(x, {})
            if sign > 0:
                victims[r.job.id] = None
            else:
                victims.pop(r.job.id, None)
                if not victims:
                    del self._victims_of[x]
            if x in self._pending:
                self._restate.add(x)

    def _name(self, queue: str, sign: int) -> None:
        before = self._named.get(queue, 0)
        _bump(self._named, queue, sign)
        if (before == 0 or before + sign == 0) and queue not in self._configured:
            self._tree = None  # a queue named only by jobs came or went

    def _order_key(self, p: PendingJob) -> _OrderKey:
        job = p.job
        order = self.config.order
        if order is OrderPolicy.FIFO:
            return (job.submit_time, 0.0, 0.0, job.id)
        if order is OrderPolicy.LAS:
            return (p.attained_gpu_seconds, job.submit_time, 0.0, job.id)
        return self._in_queue(p)  # PRIORITY, and within a queue for FAIR_SHARE / FAIR_LAS

    def _in_queue(self, p: PendingJob) -> InQueueKey:
        return self._key_when(p, p.job.id in self._promotions.promoted)

    def _key_when(self, p: PendingJob, promoted: bool) -> InQueueKey:
        arrival = self._promotions.at[p.job.id] if promoted and self._arrives else None
        return in_queue_key(p, self._thresholds, promoted, arrival)

    def _advance(self, now: float) -> None:
        """Re-key the waiting jobs whose promotion (`starvation.Promotions`) changed by `now`."""
        promoted = self._promotions.promoted
        for job_id in self._promotions.advance(now):
            p = self._pending[job_id]
            was = job_id not in promoted
            kept = self._sorted_for(p)
            kept.remove(self._key_when(p, was))
            kept.add(self._order_key(p), p)
            if self._resets:  # a promoted job preempts as level 0: another class
                self._leave(job_id)
                self._join(job_id, p, self._class_id(p, self._spared.get(job_id, NONE_SPARED)))

    def _sorted_for(self, p: PendingJob) -> _SortedJobs:
        if self.config.order not in TREE_ORDERS:
            return self._order
        found = self._per_queue.get(p.job.queue)
        if found is None:
            found = self._per_queue[p.job.queue] = _SortedJobs()
        return found

    # -- questions ------------------------------------------------------------------------------
    @property
    def pending(self) -> dict[str, PendingJob]:
        """Read only: the pending jobs by id, in the order they were added."""
        return self._pending

    @property
    def running(self) -> dict[str, RunningJob]:
        """Read only: the running jobs by id, in the order they were added."""
        return self._running

    def snapshot(self, now: float) -> Snapshot:
        return Snapshot(now, self.cluster, self.queues, tuple(self._pending.values()), tuple(self._running.values()))

    def tree(self) -> QueueTree:
        """`ordering.tree_for` of the current snapshot (kept until the queue names change)."""
        if self._tree is None:
            queues = self.queues
            if not self.config.quotas:
                extra = sorted(n for n in self._named if n not in self._configured)
                queues = queues + tuple(QueueConfig(n) for n in extra)
            self._tree = QueueTree(queues, self.cluster.usable_gpus)
        return self._tree

    def cycle(self, now: float, *, explain: bool = False) -> list[Decision]:
        """`schedule(self.snapshot(now), self.config, explain=explain)`, from the kept state."""
        cycle = Cycle(self.prepared(now), self.config)
        return cycle.run() if explain else cycle.actions()

    def prepared(self, now: float) -> Prepared:
        """What `prepared.prepare(self.snapshot(now), ...)` builds from scratch, from the kept parts."""
        self._advance(now)
        tree = self.tree()
        usage = QueueUsage(tree)
        leaving = self._leaving
        for q, g in self._held.items():
            out = leaving.get(q, 0)
            usage.add(q, g - out)
            if out:
                usage.add(q, out, active=False)
        if tree.per_user:
            for (user, q), g in self._held_users.items():
                usage.add_user(user, q, g)
        releasing: dict[int, int] = {}
        for job_id in sorted(self._preempting):
            add_masks(releasing, self._masks[job_id])
        live, sample = self._live_classes()
        return Prepared(
            snapshot=self.snapshot(now),
            tree=tree,
            usage=usage,
            fi=self._fi.copy(),
            running=self._run_index.jobs.copy(),
            releasing=releasing,
            spared=self._spared,
            order=self._ordered,
            classes=self._class,
            releases=self._releases if self.config.backfill else {},
            live=live,
            sample=sample,
            kept=self._run_index,
            thresholds=self._thresholds,
        )

    def _live_classes(self) -> tuple[dict[int | None, int], dict[int, PendingJob]]:
        """Classes in the order of their first job in the snapshot (see `shortcuts.EarlyStop`),
        with their job counts and that first job."""
        members, firsts = self._members, self._firsts
        live: dict[int | None, int] = {k: len(members[k]) for _, k in firsts}
        return live, {k: next(iter(members[k].values())) for _, k in firsts}

    def _ordered(self, usage: QueueUsage) -> Iterator[PendingJob]:
        if self.config.order not in TREE_ORDERS:
            return iter(self._order.jobs)
        tree = self.tree()
        known = {q: s.jobs for q, s in self._per_queue.items() if s.jobs and tree.known(q)}
        unknown = sorted(
            (p for q, s in self._per_queue.items() if s.jobs and not tree.known(q) for p in s.jobs), key=_BY_SUBMIT
        )
        return fair_share_walk(tree, usage, known, unknown, self._key)


K = TypeVar("K")


def _bump(counts: dict[K, int], key: K, delta: int) -> None:
    n = counts.get(key, 0) + delta
    if n:
        counts[key] = n
    else:
        counts.pop(key, None)
