"""What a quota round reads of the jobs waiting for GPUs (`corral.core.reservation`), from a
snapshot (`Backlog.of`) or kept between rounds by its owner (`KeptBacklog`), and the round's order
over it (`Order`).

Why: with thousands waiting behind full cohorts (Kueue's shape: ~13,000), a round reserves a few
dozen jobs, yet deriving its inputs from the snapshot walks every waiting job three times (each
queue's jobs sorted for the fair-share walk, the jobs and their classes for the order, the counts
and top priorities for `Exposure`): ~10 ms of a ~12 ms round, twenty rounds a second. Each of
these changes only with a job's own events, so the quota service keeps them (`KeptBacklog`,
told each job that came, changed or went) and a round reads a copy (`KeptBacklog.frozen`) equal
to what `Backlog.of` derives (property test: tests/unit/core/test_backlog_kept.py).
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

from corral.core.model import Job, PendingJob, SchedulerConfig, Snapshot
from corral.core.ordering import TREE_ORDERS, by_priority, fair_share_walk, iter_pending, key_of
from corral.core.quota import QueueTree, QueueUsage

#: (queue, GPUs, user): the jobs a quota check answers alike (the user read only when a queue sets
#: `max_gpus_per_user`)
ClassKey = tuple[str, int, str | None]
#: a job's place in its queue under fair share without levels: priority (highest first), submit time, id
_QueueKey = tuple[int, float, str]


def _queue_key(job: Job) -> _QueueKey:
    return (-job.priority, job.submit_time, job.id)


@dataclass(frozen=True, slots=True)
class Backlog:
    """The pending jobs of one round, split as the round reads them: `waiting` (no quota held, by
    id), `holders` (holding quota), `by_queue` (each queue's waiting jobs in the in-queue order of
    fair share: priority, then the oldest, then the id), `classes` (waiting jobs per (queue, GPUs,
    user)) with one `samples` job each, and over every pending job `at` (how many per queue) and
    `top` (their highest priority per queue)."""

    waiting: Mapping[str, PendingJob]
    holders: Mapping[str, Job]
    by_queue: Mapping[str, Sequence[PendingJob]]
    classes: Mapping[ClassKey, int]
    samples: Mapping[ClassKey, Job]
    at: Mapping[str, int]
    top: Mapping[str, int]

    @staticmethod
    def of(snapshot: Snapshot, reserved: Collection[str]) -> Backlog:
        """The plain definition, from the snapshot's pending jobs (`reserved`: those holding quota)."""
        waiting: dict[str, PendingJob] = {}
        holders: dict[str, Job] = {}
        queued: dict[str, list[PendingJob]] = {}
        classes: dict[ClassKey, int] = {}
        samples: dict[ClassKey, Job] = {}
        at: dict[str, int] = {}
        top: dict[str, int] = {}
        for p in snapshot.pending:  # one pass of thousands a round: kept to plain dict operations
            job = p.job
            q, priority = job.queue, job.priority
            n = at.get(q)
            if n is None:
                at[q], top[q] = 1, priority
            else:
                at[q] = n + 1
                if priority > top[q]:
                    top[q] = priority
            if job.id in reserved:
                holders[job.id] = job
                continue
            waiting[job.id] = p
            queued.setdefault(q, []).append(p)
            key = (q, job.replicas * job.gpus_per_replica, job.user)
            n = classes.get(key)
            if n is None:
                classes[key] = 1
                samples[key] = job
            else:
                classes[key] = n + 1
        return Backlog(waiting, holders, {q: by_priority(js) for q, js in queued.items()}, classes, samples, at, top)


class KeptBacklog:
    """A `Backlog` kept between rounds: `put` a job that came or changed (and whether it holds
    quota), `drop` one that no longer waits; `frozen` is the round's copy (C-level copies of the
    kept maps and lists: the owner may go on changing this one while a round reads the copy), as
    `Backlog.of` derives it from a snapshot whose pending jobs are sorted by id (the services'
    are, `ClusterView.snapshot`): the holders in that order, as the round lists its Revokes."""

    def __init__(self) -> None:
        self._waiting: dict[str, PendingJob] = {}
        self._holders: dict[str, Job] = {}
        self._keys: dict[str, list[_QueueKey]] = {}
        self._queued: dict[str, list[PendingJob]] = {}
        self._members: dict[ClassKey, dict[str, Job]] = {}
        self._at: dict[str, int] = {}
        self._priorities: dict[str, dict[int, int]] = {}  # per queue: how many pending jobs at each priority
        self._known: dict[str, PendingJob | Job] = {}  # every pending job as put

    def __len__(self) -> int:
        return len(self._known)

    def put(self, p: PendingJob, holds_quota: bool) -> None:
        self.drop(p.job.id)
        job = p.job
        self._known[job.id] = job if holds_quota else p
        q = job.queue
        self._at[q] = self._at.get(q, 0) + 1
        counts = self._priorities.setdefault(q, {})
        counts[job.priority] = counts.get(job.priority, 0) + 1
        if holds_quota:
            self._holders[job.id] = job
            return
        self._waiting[job.id] = p
        key = _queue_key(job)
        keys, queued = self._keys.setdefault(q, []), self._queued.setdefault(q, [])
        at = bisect.bisect_left(keys, key)
        keys.insert(at, key)
        queued.insert(at, p)
        self._members.setdefault((q, job.total_gpus, job.user), {})[job.id] = job

    def drop(self, job_id: str) -> None:
        was = self._known.pop(job_id, None)
        if was is None:
            return
        job = was.job if isinstance(was, PendingJob) else was
        q = job.queue
        self._at[q] -= 1
        if not self._at[q]:
            del self._at[q], self._priorities[q]
        else:
            counts = self._priorities[q]
            counts[job.priority] -= 1
            if not counts[job.priority]:
                del counts[job.priority]
        if self._holders.pop(job_id, None) is not None:
            return
        del self._waiting[job_id]
        keys, queued = self._keys[q], self._queued[q]
        at = bisect.bisect_left(keys, _queue_key(job))
        del keys[at], queued[at]
        if not keys:
            del self._keys[q], self._queued[q]
        key = (q, job.total_gpus, job.user)
        members = self._members[key]
        del members[job_id]
        if not members:
            del self._members[key]

    def frozen(self) -> Backlog:
        return Backlog(
            waiting=dict(self._waiting), holders=dict(sorted(self._holders.items())),
            by_queue={q: tuple(js) for q, js in self._queued.items()},
            classes={k: len(m) for k, m in self._members.items()},
            samples={k: next(iter(m.values())) for k, m in self._members.items()},
            at=dict(self._at), top={q: max(counts) for q, counts in self._priorities.items()},
        )


class Order:
    """The round's order of the waiting jobs (`iter_pending`), walked only as far as a pass reads it.

    The fair-share walk orders every waiting job (charging each one's GPUs to its queue as if it
    were admitted, to order the next): with thousands waiting behind full cohorts, walking it whole
    costs a third of quota's round for the few dozen jobs a round can reserve. The passes of a round
    read one order, each as far as it must. `jobs` is every waiting job by id; `classes` how many
    wait per (queue, GPUs[, user]) and `samples` one of them (`reservation._Left`)."""

    def __init__(self, snapshot: Snapshot, config: SchedulerConfig, tree: QueueTree, backlog: Backlog) -> None:
        self.backlog = backlog
        self.jobs = backlog.waiting
        #: a job's answer depends on its user too when a queue sets `max_gpus_per_user` (`class_of`)
        self.by_user = by_user = tree.per_user
        if by_user:
            self.classes, self.samples = dict(backlog.classes), dict(backlog.samples)
        else:
            self.classes, self.samples = {}, {}
            for (q, gpus, _), n in backlog.classes.items():
                key = (q, gpus, None)
                self.classes[key] = self.classes.get(key, 0) + n
                self.samples.setdefault(key, backlog.samples[(q, gpus, _)])
        self._walk: Iterator[PendingJob] | None = _walk(snapshot, config, tree, backlog)
        self._known: list[PendingJob] = []
        self.tree_order = config.order in TREE_ORDERS
        self._key = key_of(config, snapshot.now) if self.tree_order else None
        self._queues: Mapping[str, Sequence[PendingJob]] | None = None

    def queues(self) -> Mapping[str, Sequence[PendingJob]]:
        """Each queue's waiting jobs in the order the fair-share walk takes them (its in-queue
        key); only under a tree order (`TREE_ORDERS`), where the walk interleaves these lists."""
        if self._queues is None:
            by_queue, key = self.backlog.by_queue, self._key
            self._queues = by_queue if key is None else {q: sorted(js, key=key) for q, js in by_queue.items()}
        return self._queues

    def __iter__(self) -> Iterator[PendingJob]:
        known = self._known
        i = 0
        while True:
            if i < len(known):
                yield known[i]
                i += 1
                continue
            if self._walk is None:
                return
            p = next(self._walk, None)
            if p is None:
                self._walk = None
                return
            known.append(p)

    def after(self, n: int, pending: Sequence[PendingJob]) -> list[PendingJob]:
        """The jobs after the first `n` of the order: those walked, in order, then the other
        waiting jobs in `pending`'s order."""
        if self._walk is None:
            return self._known[n:]
        walked = {p.job.id for p in self._known}
        jobs = self.jobs
        return self._known[n:] + [p for p in pending if p.job.id in jobs and p.job.id not in walked]


def _walk(snapshot: Snapshot, config: SchedulerConfig, tree: QueueTree, backlog: Backlog) -> Iterator[PendingJob]:
    """`iter_pending` over the backlog's waiting jobs; under fair share without levels, from its
    queues already in order (the order never reads the jobs' order in the snapshot: every sort
    key ends with the job's id). Lazy: a round whose passes do not walk (`flat_pass`) derives
    nothing of it."""
    if config.order not in TREE_ORDERS or key_of(config, snapshot.now) is not None:
        waiting = Snapshot(snapshot.now, snapshot.cluster, snapshot.queues, tuple(backlog.waiting.values()),
                           snapshot.running)
        yield from iter_pending(waiting, config, tree=tree)
        return
    known = {q: list(js) for q, js in backlog.by_queue.items() if tree.known(q)}
    unknown = sorted((p for q, js in backlog.by_queue.items() if not tree.known(q) for p in js),
                     key=lambda p: (p.job.submit_time, p.job.id))
    yield from fair_share_walk(tree, QueueUsage.of(tree, snapshot.running), known, unknown)
