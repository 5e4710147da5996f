"""Quota reservation: which waiting jobs get their queue's quota this round (the quota service).

Quota is reserved job by job in fair-share order (`order_pending`), each checked against the queue
tree (`quota_check`) with the usage of everything running or already reserved. A reservation lets
placement start the job as soon as it fits.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from corral.core.decisions import Pending
from corral.core.model import Job, SchedulerConfig, Snapshot
from corral.core.ordering import order_pending, tree_for
from corral.core.quota import QueueTree, QueueUsage, quota_check


@dataclass(frozen=True, slots=True)
class Reserve:
    """Reserve `gpus` of the job's queue for it; `borrowed` of them are above the queue's own
    guarantee (what a reclaim may take back)."""

    job_id: str
    gpus: int
    borrowed: int


def reserve_quota(
    snapshot: Snapshot,
    config: SchedulerConfig = SchedulerConfig(),
    *,
    reserved: Collection[str] = frozenset(),
    held: Iterable[tuple[str, int]] = (),
) -> list[Reserve | Pending]:
    """One decision per pending job not in `reserved`, in fair-share order: Reserve, or Pending
    with the quota reason. `snapshot.pending` holds every job waiting for GPUs; `reserved` names
    those among them that already hold quota (they count as used and are not decided again);
    `held` is (queue, GPUs) still reserved by jobs neither running nor pending (not given back yet)."""
    tree = tree_for(snapshot, config)
    usage = QueueUsage.of(tree, snapshot.running)
    for queue, gpus in held:
        if tree.known(queue):
            usage.add(queue, gpus)
    waiting = [p for p in snapshot.pending if p.job.id not in reserved]
    for p in snapshot.pending:  # reserved but not yet placed counts too
        if p.job.id in reserved and tree.known(p.job.queue):
            usage.add(p.job.queue, p.job.total_gpus)
    order = order_pending(
        Snapshot(snapshot.now, snapshot.cluster, snapshot.queues, tuple(waiting), snapshot.running), config, tree=tree
    )
    out: list[Reserve | Pending] = []
    for p in order:
        job = p.job
        blocked = quota_check(snapshot, job, usage, tree=tree, quotas=config.quotas)
        if blocked is not None:
            out.append(Pending(job.id, blocked))
            continue
        out.append(Reserve(job.id, job.total_gpus, _borrowed(tree, usage, job)))
        usage.add(job.queue, job.total_gpus)
    return out


def _borrowed(tree: QueueTree, usage: QueueUsage, job: Job) -> int:
    """GPUs of this reservation above the queue's own guarantee (what a reclaim may take back)."""
    guarantee = tree.guarantee.get(job.queue, 0)
    used = usage.held.get(job.queue, 0)
    return max(0, min(job.total_gpus, used + job.total_gpus - guarantee))
