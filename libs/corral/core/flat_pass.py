"""A quota pass taken queue by queue (`corral.core.reservation`), where the fair-share order changes
no decision: every queue with waiting jobs is a child of the root and the quota check answers
alike on any usage for its jobs (`quota_checks.usage_blind`).

Why: on such a tree (the Philly replays': equal guarantees, borrowing without a lend limit) a
pass reserves every waiting job the check lets through, and what a reservation says reads only
its own queue's usage at its turn: its borrowed GPUs (`reservation._borrowed`) and whether it is
exposed (`Exposure.of`, whose usage clause reads the queues on the job's path: here the queue
alone, `Exposure.over`). The fair-share walk only interleaves the queues' own orders
(`Order.queues`), so each queue's jobs, taken in that order, get the decisions the walk gives
them; the walk of the whole backlog, the biggest part of a pass with hundreds waiting, is not
needed, and what a pass reads of each job (its check, its GPUs, `Exposure.fixed`) is read once a
round (`FlatOrder`): a pass is a few list operations per queue. The decisions come queue by queue
instead of in the walk's order: for the rounds that read which jobs are reserved, not in what
order (`reserve_quota(explain=False)`, the simulator's).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Mapping
from itertools import accumulate, compress

from corral.core.backlog import Order
from corral.core.decisions import Reason
from corral.core.exposure import Exposure, Key, key
from corral.core.model import Job
from corral.core.quota import QueueTree, QueueUsage
from corral.core.quota_checks import Checks, usage_blind


def applies(order: Order, tree: QueueTree) -> bool:
    """Whether a pass over `order` may be taken queue by queue (see the module docstring)."""
    return order.tree_order and all(
        tree.known(q) and tree.parent(q) == "" and usage_blind(tree, q) for q in order.backlog.by_queue)


class _Queue:
    """One queue's waiting jobs the check lets through, in its order, with what a pass reads of each."""

    __slots__ = ("exposed", "gpus", "ids", "jobs", "over", "usage_bound")

    def __init__(self, jobs: list[Job], exposure: Exposure, over: int | None) -> None:
        self.jobs = jobs
        self.ids = [j.id for j in jobs]
        self.gpus = [j.total_gpus for j in jobs]
        answers: dict[Key, bool | None] = {}  # `fixed` reads `key(job)` of a job
        fixed = []
        for j in jobs:
            k = key(j)
            fixed.append(answers[k] if k in answers else answers.setdefault(k, exposure.fixed(j)))
        self.exposed = [f is True for f in fixed]  # whatever the usage
        self.usage_bound = [f is None for f in fixed] if over is not None else None  # once over `over`
        self.over = over


class FlatOrder:
    """A round's waiting jobs queue by queue (`Order.queues`), each read once for the round's passes
    (`take`); `refusals`: the quota check's, (job id, reason), fixed for the round."""

    def __init__(self, order: Order, exposure: Exposure, check: Checks) -> None:
        self.refusals: list[tuple[str, Reason]] = []
        self.queues: dict[str, _Queue] = {}
        self.tree = exposure.tree
        by_user = check.by_user
        for q, pending in order.queues().items():
            jobs = []
            answers: dict[object, Reason | None] = {}  # the check reads the job's GPUs (and user, `by_user`)
            for p in pending:
                j = p.job
                k = (j.total_gpus, j.user) if by_user else j.total_gpus
                why = answers[k] if k in answers else answers.setdefault(k, check(j))
                if why is None:
                    jobs.append(j)
                else:
                    self.refusals.append((j.id, why))
            self.queues[q] = _Queue(jobs, exposure, exposure.over(q))

    def take(self, usage: QueueUsage, refused: Mapping[str, Reason]) -> FlatPass:
        """The pass with the jobs of `refused` counting for nothing; `usage` grows by its reservations."""
        return FlatPass(self, usage, refused)


class FlatPass:
    """One pass: `admitted` (the jobs reserved, queue by queue), `borrowing` (exposed already at
    their turn), `exposed` (`borrowing` and those exposed on the pass's final usage), `held`
    (each queue's GPUs held at the pass's start: `reserves` words the reservations from it)."""

    __slots__ = ("admitted", "borrowing", "exposed", "flat", "held")

    def __init__(self, flat: FlatOrder, usage: QueueUsage, refused: Mapping[str, Reason]) -> None:
        self.flat, self.admitted, self.borrowing, self.exposed = flat, [], set(), set()
        self.held = dict(usage.held)
        held, active, per_user = usage.held, usage.active, flat.tree.per_user
        for q, queue in flat.queues.items():
            keep = [i not in refused for i in queue.ids] if refused else None
            gpus = queue.gpus if keep is None else list(compress(queue.gpus, keep))
            if not gpus:
                continue
            jobs = queue.jobs if keep is None else list(compress(queue.jobs, keep))
            self.admitted.extend(jobs)
            start = active.get(q, 0)
            total = sum(gpus)
            held[q] = held.get(q, 0) + total
            active[q] = start + total
            if per_user:
                for j in jobs:
                    if j.user is not None:
                        usage.add_user(j.user, q, j.total_gpus)
            ids = queue.ids if keep is None else list(compress(queue.ids, keep))
            fixed = list(compress(ids, queue.exposed if keep is None else compress(queue.exposed, keep)))
            self.borrowing.update(fixed)
            self.exposed.update(fixed)
            if queue.over is None or start + total <= queue.over:
                continue
            assert queue.usage_bound is not None
            bound = queue.usage_bound if keep is None else list(compress(queue.usage_bound, keep))
            # exposed at its turn once the queue's active usage with it counted is over the bound
            at = bisect_right(list(accumulate(gpus, initial=start)), queue.over, lo=1) - 1
            self.borrowing.update(compress(ids[at:], bound[at:]))
            self.exposed.update(compress(ids, bound))

    def reserves(self) -> Iterator[tuple[Job, int]]:
        """Each job admitted with its GPUs above its queue's guarantee at its turn (`_borrowed`)."""
        guarantee = self.flat.tree.guarantee
        used: dict[str, int] = {}
        for job in self.admitted:
            q, gpus = job.queue, job.total_gpus
            u = used.get(q)
            if u is None:
                u = self.held.get(q, 0)
            yield job, max(0, min(gpus, u + gpus - guarantee.get(q, 0)))
            used[q] = u + gpus
