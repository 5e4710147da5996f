"""The words of the cycle's answers: each Reason a cycle step gives, built in one place.

Why: the messages and details a user reads (`corral why`), written inline in the steps that
decide, make a step half rule, half prose. The steps say which answer; the answers are worded here.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from corral.core.backfill import Reservation
from corral.core.decisions import Reason, ReasonCode
from corral.core.model import Job, OrderPolicy, Placement, RunningJob


def placed(job: Job, placement: Placement, reservation: Reservation | None) -> Reason:
    nodes = placement.nodes()
    if reservation is not None:
        code, how = ReasonCode.BACKFILLED, f"backfilled without delaying job {reservation.holder}"
    else:
        code, how = ReasonCode.PLACED, "placed"
    return Reason(
        code,
        f"{how}: {job.shape} on {len(nodes)} node(s)",
        (("gpus", job.total_gpus), ("nodes", len(nodes))),
    )


def ordered_behind(blocker: Job, order: OrderPolicy, free: int) -> Reason:
    return Reason(
        ReasonCode.ORDERED_BEHIND,
        f"behind job {blocker.id} in {order.value} order; it needs {blocker.total_gpus} GPUs and {free} are free",
        (("blocked_by", blocker.id), ("needs_gpus", blocker.total_gpus), ("free_gpus", free)),
    )


def held_for_guarantee(job: Job, starved: int, starved_for: Job, free: int) -> Reason:
    """`starved`: GPUs the guaranteed jobs that do not fit are owed; of the `free` GPUs, that many
    (at most all) are held for them."""
    held = min(starved, free)
    return Reason(
        ReasonCode.RESERVED_FOR,
        f"{held} free GPUs are held for guaranteed jobs owed {starved} "
        f"(first: {starved_for.id} of queue {starved_for.queue}); queue {job.queue} would borrow them",
        (("reserved_for", starved_for.id), ("reserved_gpus", held), ("owed_gpus", starved)),
    )


def owed_by_hold(reason: Reason) -> int | None:
    """The GPUs owed that `held_for_guarantee`'s `reason` counts (None: another reason). They grow
    as guaranteed jobs starve, which changes no GPUs: a class's shared hold is stale once they did."""
    owed = reason.detail("owed_gpus") if reason.code is ReasonCode.RESERVED_FOR else None
    return owed if isinstance(owed, int) else None


def waiting_for_preemption(job: Job, coming: int) -> Reason:
    return Reason(
        ReasonCode.WAITING_FOR_PREEMPTION,
        f"waiting for {coming} GPUs that preempted jobs are releasing; {job.total_gpus - coming} "
        "free GPUs are held for it",
        (("releasing_gpus", coming), ("held_gpus", job.total_gpus - coming)),
    )


def reserved_for(job: Job, r: Reservation, now: float) -> Reason:
    return Reason(
        ReasonCode.RESERVED_FOR,
        r.describe(now) + f"; starting {job.id} now would delay it",
        (("reserved_for", r.holder), ("reserved_gpus", r.gpus), ("shadow_time", r.shadow_time)),
    )


def names_the_reservation(reason: Reason) -> bool:
    """Whether `reason` is `reserved_for`'s (the backfill reservation, reworded for each job that
    would delay it), not another RESERVED_FOR such as `held_for_guarantee`'s, which a class shares
    while the GPUs it counts as owed are unchanged (`owed_by_hold`)."""
    return reason.code is ReasonCode.RESERVED_FOR and any(key == "shadow_time" for key, _ in reason.details)


def with_standing(reason: Reason, queue: str, used: int, guaranteed: int) -> Reason:
    """`reason`, with the fair-share state of the job's queue: "GANG_DOES_NOT_FIT: 0 free" alone
    does not say that the queue is under its guarantee, i.e. first in fair-share order."""
    where = ("under its guarantee" if used < guaranteed else
             f"borrows {used - guaranteed}" if used > guaranteed else "at its guarantee")
    return Reason(
        reason.code,
        reason.message + f"; queue {queue} uses {used} of {guaranteed} guaranteed GPUs ({where})",
        (*reason.details, ("queue_used", used), ("queue_guaranteed", guaranteed)),
    )


def with_reservation(reason: Reason, r: Reservation) -> Reason:
    """`reason`, saying that the job now holds the backfill reservation `r`."""
    return Reason(
        reason.code,
        reason.message
        + f"; holds a reservation of {r.gpus} GPUs"
        + ("" if math.isinf(r.shadow_time) else f" from t={r.shadow_time:.0f}"),
        (*reason.details, ("reserved_gpus", r.gpus), ("shadow_time", r.shadow_time)),
    )


def preempting(kinds: Collection[ReasonCode], victims: Sequence[RunningJob], now: float) -> Reason:
    """Why victims are preempted, and what it costs. Lost work counts from each victim's last
    checkpoint (`RunningJob.lost_work`), and a victim with a checkpoint grace is asked to write one
    first: the work since its last checkpoint is lost only if it stops without one, so a victim
    that checkpoints at the signal loses nothing."""
    unsaved = sum(v.lost_work(now) for v in victims)
    gpus = sum(v.placement.gpu_count for v in victims)
    ids = ", ".join(sorted(v.job.id for v in victims))
    if ReasonCode.RECLAIMED_FOR_GUARANTEE in kinds:
        code, why = ReasonCode.RECLAIMED_FOR_GUARANTEE, "reclaiming guaranteed GPUs from borrowing queues"
    elif ReasonCode.PREEMPTED_FOR_LAS in kinds:
        code, why = ReasonCode.PREEMPTED_FOR_LAS, "victims attained far more service"
    elif ReasonCode.PREEMPTED_TO_DEFRAGMENT in kinds:
        code, why = ReasonCode.PREEMPTED_TO_DEFRAGMENT, "victims restart on idle GPUs elsewhere, making room for it"
    else:
        code = ReasonCode.PREEMPTED_FOR_PRIORITY
        why = f"victims have lower priority (max {max(v.job.priority for v in victims)})"
    grace = min(v.job.checkpoint_grace_seconds for v in victims)
    cost = (
        f"{unsaved:.0f} GPU-seconds since their last checkpoint are lost only if they stop without "
        f"checkpointing (they are asked to, within {grace} s)"
        if grace > 0
        else f"{unsaved:.0f} GPU-seconds since their last checkpoint are lost (no checkpoint grace)"
    )
    return Reason(
        code,
        f"preempting {len(victims)} job(s) ({ids}) holding {gpus} GPUs, {why}; {cost}",
        (("victims", len(victims)), ("freed_gpus", gpus), ("unsaved_gpu_seconds", unsaved),
         ("checkpoint_grace_seconds", grace)),
    )
