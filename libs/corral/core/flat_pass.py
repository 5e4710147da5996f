"""A quota pass taken queue by queue (`corral.core.reservation`), where the fair-share order changes
no decision: every queue with waiting jobs is a child of the root and the quota check answers
alike on any usage for its jobs (`quota_checks.usage_blind`).

Why: on such a tree (the Philly replays': equal guarantees, borrowing without a lend limit) a
pass reserves every waiting job the check lets through, and what a reservation says reads only
its own queue's usage at its turn: its borrowed GPUs (`reservation._borrowed`) and whether it is
exposed (`Exposure.of`, whose usage clause reads the queues on the job's path: here the queue
alone). The fair-share walk only interleaves the queues' own orders (`Order.queues`), so each
queue's jobs, taken in that order, get the decisions the walk gives them; the walk of the whole
backlog, the biggest part of a pass with hundreds waiting, is not needed. The decisions come
queue by queue instead of in the walk's order: for the rounds that read which jobs are reserved,
not in what order (`reserve_quota(explain=False)`, the simulator's).
"""

from __future__ import annotations

from collections.abc import Mapping

from corral.core.backlog import Order
from corral.core.decisions import Reason
from corral.core.exposure import Exposure, Growing
from corral.core.model import Job
from corral.core.quota import QueueTree, QueueUsage
from corral.core.quota_checks import Checks, usage_blind


def applies(order: Order, tree: QueueTree) -> bool:
    """Whether a pass over `order` may be taken queue by queue (see the module docstring)."""
    return order.tree_order and all(
        tree.known(q) and tree.parent(q) == "" and usage_blind(tree, q) for q in order.backlog.by_queue)


class FlatPass:
    """One pass's result, queue by queue: `admitted` (the jobs reserved) with `borrowed` (each one's
    GPUs above its queue's guarantee), `borrowing` (exposed already at their turn), and the
    refusals by the quota check (`refused`: the play-out's, given)."""

    __slots__ = ("admitted", "borrowed", "borrowing", "refusals")

    def __init__(self, order: Order, usage: QueueUsage, exposure: Exposure, check: Checks,
                 refused: Mapping[str, Reason]) -> None:
        """Take the pass: `usage` grows by each reservation, as `_quota_pass` grows it."""
        tree = exposure.tree
        held, active, per_user = usage.held, usage.active, tree.per_user
        exposed_now = Growing(exposure, usage)
        self.admitted: list[Job] = []
        self.borrowed: list[int] = []
        self.borrowing: set[str] = set()
        self.refusals: list[tuple[str, Reason]] = []
        admit, borrowed, refuse = self.admitted.append, self.borrowed.append, self.refusals.append
        for q, jobs in order.queues().items():
            guarantee = tree.guarantee.get(q, 0)
            used = held.get(q, 0)
            for p in jobs:
                job = p.job
                if job.id in refused:
                    continue
                blocked = check(job)
                if blocked is not None:
                    refuse((job.id, blocked))
                    continue
                gpus = job.total_gpus
                borrowed(max(0, min(gpus, used + gpus - guarantee)))
                used += gpus
                held[q] = used
                active[q] = active.get(q, 0) + gpus
                if per_user and job.user is not None:
                    usage.add_user(job.user, q, gpus)
                admit(job)
                if exposed_now(job):
                    self.borrowing.add(job.id)
