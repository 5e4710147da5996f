"""`max_gpus_per_user`: how many GPUs one user's jobs may hold at once in a queue and the queues
below it (Slurm's MaxTRESPerUser=gres/gpu, whose pending reason is QOSMaxGRESPerUser).

The rule, as `quota_check` asks it: a job of user U may take its GPUs when, for every queue Q on
its path (its own and every one above it) that sets a limit L, the GPUs held by U's jobs anywhere
in Q's subtree plus the job's own are at most L; else it waits, MAX_GPUS_PER_USER, naming Q, L,
what U holds and what the job needs. A job with no user is not limited. Like `max_gpus`, it is
enforced by every step (quota, placement, preemption): a hard ceiling, never borrowed past.

`held` is kept by `QueueUsage` only for the queues on a path that set a limit (a tree without any
keeps nothing), keyed (user, queue).
"""

from __future__ import annotations

from collections.abc import Mapping

from corral.core.decisions import Reason, ReasonCode

__all__ = ["over_user_limit"]


def over_user_limit(limits: tuple[tuple[str, int], ...], held: Mapping[tuple[str, str], int], user: str | None,
                    gpus: int) -> Reason | None:
    """MAX_GPUS_PER_USER for the first queue of `limits` ((queue, limit) on the job's path, leaf
    first) that `user` would go over by taking `gpus` more; None when within all of them."""
    if user is None:
        return None
    for queue, limit in limits:
        used = held.get((user, queue), 0)
        if used + gpus > limit:
            return Reason(
                ReasonCode.MAX_GPUS_PER_USER,
                f"user {user} holds {used} GPUs in queue {queue}, whose max_gpus_per_user is {limit}; "
                f"job needs {gpus} more",
                (("queue", queue), ("user", user), ("used", used), ("max_gpus_per_user", limit), ("needs_gpus", gpus)),
            )
    return None
