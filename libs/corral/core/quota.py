"""The queue tree: guarantees, borrowing, lend limits, ceilings, and the fair-share key.

Semantics (Kueue-like cohorts, generalised to a tree):
- a queue's usage counts its whole subtree;
- `max_gpus` is a hard ceiling at every level and is never exceeded;
- usage within `guaranteed_gpus` is a right: it is admitted even if borrowers currently sit on it
  (reclaim then frees the GPUs);
- usage above the guarantee is borrowed, at each level, from what siblings lend (their unused
  guarantee, capped by `lend_limit`), from the parent's guarantee not assigned to any child, and
  from whatever the parent itself may borrow one level up (checked there). At the top level the
  parent is the cluster: GPUs not guaranteed to any top-level queue are free for all. When no
  sibling sets a `lend_limit`, a level does not limit borrowing at all: free capacity (placement)
  does, and a shortage is reported as GANG_DOES_NOT_FIT rather than as a quota problem.
Queues named by jobs but not configured are unknown (QUEUE_UNKNOWN); ancestors that are not
configured are implicit, with a guarantee equal to the sum of their children's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from corral.core.decisions import Reason, ReasonCode
from corral.core.model import Job, QueueConfig, RunningJob, Snapshot
from corral.core.user_gpus import over_user_limit

ROOT = ""


class QueueTree:
    """Configured queues plus implicit ancestors, with parent/children links."""

    __slots__ = ("capacity", "ceilings", "children", "configs", "guarantee", "limited", "paths", "per_user",
                 "user_ceilings")

    def __init__(self, queues: Iterable[QueueConfig], capacity: int):
        self.capacity = capacity
        self.configs: dict[str, QueueConfig] = {}
        for q in queues:
            if q.name in self.configs:
                raise ValueError(f"queue {q.name!r} is configured twice; queue names must be unique")
            self.configs[q.name] = q
        names = set(self.configs)
        for name in list(names):
            parts = name.split("/")
            names.update("/".join(parts[:n]) for n in range(1, len(parts)))
        self.children: dict[str, list[str]] = {ROOT: []}
        for name in sorted(names):
            self.children.setdefault(name, [])
            head, sep, _ = name.rpartition("/")
            self.children.setdefault(head if sep else ROOT, []).append(name)
        self.guarantee: dict[str, int] = {}
        for name in sorted(names, key=lambda n: -n.count("/")):
            cfg = self.configs.get(name)
            self.guarantee[name] = (
                cfg.guaranteed_gpus if cfg is not None else sum(self.guarantee[c] for c in self.children[name])
            )
        self.guarantee[ROOT] = capacity
        self.paths: dict[str, tuple[str, ...]] = {}
        # per queue: whether any sibling sets a lend_limit (if none, borrowing there is limited
        # only by free capacity), and the ceilings on its path; asked for every pending job
        self.limited: dict[str, bool] = {
            q: any(self.lend_limit(s) != math.inf for s in self.children[self.parent(q)] if s != q)
            for q in self.guarantee
            if q != ROOT
        }
        self.ceilings: dict[str, tuple[tuple[str, int], ...]] = {}
        #: whether any queue sets `max_gpus_per_user` (else nothing is kept per user)
        self.per_user = any(q.max_gpus_per_user is not None for q in self.configs.values())
        self.user_ceilings: dict[str, tuple[tuple[str, int], ...]] = {}

    @classmethod
    def of(cls, snapshot: Snapshot) -> QueueTree:
        return cls(snapshot.queues, snapshot.cluster.usable_gpus)

    def known(self, name: str) -> bool:
        return name in self.guarantee and name != ROOT

    def parent(self, name: str) -> str:
        head, sep, _ = name.rpartition("/")
        return head if sep else ROOT

    def path(self, name: str) -> tuple[str, ...]:
        """The queue and its ancestors, leaf first, without the root."""
        p = self.paths.get(name)
        if p is None:
            parts = name.split("/")
            p = tuple("/".join(parts[:n]) for n in range(len(parts), 0, -1))
            self.paths[name] = p
        return p

    def ceilings_of(self, name: str) -> tuple[tuple[str, int], ...]:
        """(queue, max_gpus) for every queue on the path that has a ceiling, leaf first."""
        c = self.ceilings.get(name)
        if c is None:
            c = self.ceilings[name] = tuple(
                (q, m) for q in self.path(name) if (m := self.max_gpus(q)) is not None
            )
        return c

    def user_ceilings_of(self, name: str) -> tuple[tuple[str, int], ...]:
        """(queue, max_gpus_per_user) for every queue on the path that sets one, leaf first."""
        c = self.user_ceilings.get(name)
        if c is None:
            c = self.user_ceilings[name] = tuple(
                (q, m) for q in self.path(name) if (cfg := self.configs.get(q)) is not None
                and (m := cfg.max_gpus_per_user) is not None
            )
        return c

    def max_gpus(self, name: str) -> int | None:
        cfg = self.configs.get(name)
        return None if cfg is None else cfg.max_gpus

    def lend_limit(self, name: str) -> float:
        cfg = self.configs.get(name)
        return math.inf if cfg is None or cfg.lend_limit is None else cfg.lend_limit

    def weight(self, name: str) -> float:
        cfg = self.configs.get(name)
        return 1.0 if cfg is None else cfg.weight

    def unassigned(self, parent: str) -> int:
        """The parent's guarantee that none of its children holds: shared by all of them."""
        return max(0, self.guarantee[parent] - sum(self.guarantee[c] for c in self.children[parent]))


class QueueUsage:
    """GPUs held per queue subtree. `held` counts every holder; `active` excludes jobs already
    preempting (they are leaving), which is what reclaim reasons about. `users`: GPUs held per
    (user, queue), for the queues that set `max_gpus_per_user` (only when the tree has one)."""

    __slots__ = ("active", "held", "tree", "users")

    def __init__(self, tree: QueueTree):
        self.tree = tree
        self.held: dict[str, int] = {}
        self.active: dict[str, int] = {}
        self.users: dict[tuple[str, str], int] = {}

    @classmethod
    def of(cls, tree: QueueTree, running: Iterable[RunningJob]) -> QueueUsage:
        held: dict[str, int] = {}
        leaving: dict[str, int] = {}
        by_user: dict[tuple[str, str], int] = {}
        per_user = tree.per_user
        for r in running:  # per leaf first, then up the tree once per queue
            job = r.job
            g = r.placement.gpu_count
            held[job.queue] = held.get(job.queue, 0) + g
            if r.preempting:
                leaving[job.queue] = leaving.get(job.queue, 0) + g
            if per_user and job.user is not None:
                by_user[(job.user, job.queue)] = by_user.get((job.user, job.queue), 0) + g
        u = cls(tree)
        for q, g in held.items():
            u.add(q, g - leaving.get(q, 0))
            if q in leaving:
                u.add(q, leaving[q], active=False)
        for (user, q), g in by_user.items():
            u.add_user(user, q, g)
        return u

    def add(self, queue: str, gpus: int, *, active: bool = True, user: str | None = None) -> None:
        for q in self.tree.path(queue):
            self.held[q] = self.held.get(q, 0) + gpus
            if active:
                self.active[q] = self.active.get(q, 0) + gpus
        if user is not None and self.tree.per_user:
            self.add_user(user, queue, gpus)

    def add_user(self, user: str, queue: str, gpus: int) -> None:
        """`gpus` more (or fewer) held by `user`'s jobs of `queue`, where a limit counts them."""
        users = self.users
        for q, _ in self.tree.user_ceilings_of(queue):
            users[(user, q)] = users.get((user, q), 0) + gpus

    def deactivate(self, queue: str, gpus: int) -> None:
        """A running job was chosen as a victim: it still holds GPUs but is no longer borrowing."""
        for q in self.tree.path(queue):
            self.active[q] = self.active.get(q, 0) - gpus

    def copy(self) -> QueueUsage:
        u = QueueUsage(self.tree)
        u.held = dict(self.held)
        u.active = dict(self.active)
        u.users = dict(self.users)
        return u


def within_guarantee(tree: QueueTree, usage: QueueUsage, queue: str, gpus: int, upto: str | None = None) -> bool:
    """Whether adding `gpus` keeps `queue` (and its ancestors, up to and including `upto`) within
    their guarantees, counting only active usage: such a request is entitled to reclaim."""
    if not tree.known(queue):
        return False
    for q in tree.path(queue):
        if usage.active.get(q, 0) + gpus > tree.guarantee[q]:
            return False
        if q == upto:
            break
    return True


def below_guarantee(tree: QueueTree, usage: QueueUsage, queue: str, upto: str | None = None) -> bool:
    """Whether `queue` (and its ancestors, up to and including `upto`) hold strictly less than
    their guarantees in active usage: short of what they are owed, whatever the request's size."""
    if not tree.known(queue):
        return False
    for q in tree.path(queue):
        if usage.active.get(q, 0) >= tree.guarantee[q]:
            return False
        if q == upto:
            break
    return True


def quota_check(
    snapshot: Snapshot,
    job: Job,
    usage: QueueUsage | None = None,
    *,
    tree: QueueTree | None = None,
    quotas: bool = True,
) -> Reason | None:
    """None when the queue tree admits `job` now; else QUEUE_UNKNOWN, MAX_GPUS_EXCEEDED,
    MAX_GPUS_PER_USER or QUOTA_EXCEEDED with the numbers. `quotas=False` checks only ceilings (the
    queues' and the per-user ones: baseline policies, placement)."""
    tree = tree if tree is not None else QueueTree.of(snapshot)
    usage = usage if usage is not None else QueueUsage.of(tree, snapshot.running)
    g = job.total_gpus
    if not tree.known(job.queue):
        if not quotas:
            return None
        known = ", ".join(sorted(tree.configs)) or "none"
        return Reason(
            ReasonCode.QUEUE_UNKNOWN,
            f"queue {job.queue} is not configured (configured queues: {known}); create it or fix the job's queue",
            (("queue", job.queue),),
        )
    over_ceiling = _over_ceiling(tree, usage, job)
    if over_ceiling is None and tree.per_user:
        over_ceiling = over_user_limit(tree.user_ceilings_of(job.queue), usage.users, job.user, g)
    if over_ceiling is not None or not quotas:
        return over_ceiling
    for q in tree.path(job.queue):
        used = usage.held.get(q, 0)
        guar = tree.guarantee[q]
        over_before = max(0, used - guar)
        over_after = max(0, used + g - guar)
        if over_after == over_before:
            continue
        if not tree.limited[q]:
            continue  # siblings lend all they do not use: only capacity (placement) limits borrowing
        available = _cohort_available(tree, usage, q, g)
        if over_after > available:
            cohort_lends = int(max(0, available - over_before))
            return Reason(
                ReasonCode.QUOTA_EXCEEDED,
                f"queue {q} uses {used} of {guar} guaranteed GPUs, job needs {g} more, cohort lends {cohort_lends}",
                (
                    ("queue", q),
                    ("used", used),
                    ("guaranteed_gpus", guar),
                    ("needs_gpus", g),
                    ("cohort_lends", cohort_lends),
                ),
            )
    return None


def _over_ceiling(tree: QueueTree, usage: QueueUsage, job: Job) -> Reason | None:
    """MAX_GPUS_EXCEEDED when a queue on the job's path would go over its ceiling."""
    g = job.total_gpus
    for q, ceiling in tree.ceilings_of(job.queue):
        used = usage.held.get(q, 0)
        if used + g > ceiling:
            return Reason(
                ReasonCode.MAX_GPUS_EXCEEDED,
                f"queue {q} uses {used} of max {ceiling} GPUs; job needs {g} more",
                (("queue", q), ("used", used), ("max_gpus", ceiling), ("needs_gpus", g)),
            )
    return None


def _cohort_available(tree: QueueTree, usage: QueueUsage, q: str, g: int) -> float:
    """GPUs queue q may borrow beyond its guarantee: what its siblings lend (within their lend
    limits, less what they borrow), what nobody is guaranteed, and its parent's own borrowing."""
    parent = tree.parent(q)
    lends = 0.0
    borrowed = 0
    for s in tree.children[parent]:
        if s == q:
            continue
        su = usage.held.get(s, 0)
        sg = tree.guarantee[s]
        lends += min(max(0, sg - su), tree.lend_limit(s))
        borrowed += max(0, su - sg)
    parent_over = 0 if parent == ROOT else max(0, usage.held.get(parent, 0) + g - tree.guarantee[parent])
    return lends + tree.unassigned(parent) + parent_over - borrowed


def share_key(tree: QueueTree, usage: QueueUsage, queue: str) -> tuple[int, float]:
    """Fair-share key of a queue among its siblings (smaller goes first): queues below their
    guarantee first, by the fraction of it they use (dominant share over entitlement); then
    borrowers, by borrowed GPUs per unit of weight (the surplus is shared by weight)."""
    used = usage.held.get(queue, 0)
    guar = tree.guarantee.get(queue, 0)
    if used < guar:
        return (0, used / guar)
    return (1, (used - guar) / tree.weight(queue))
