"""Attained service in discrete levels, as Tiresias' 2D-LAS has it, and the order inside a queue.

A job's attained service is GPUs x seconds it has run (all attempts). Ranked by the exact value,
two jobs that differ by a few GPU-seconds swap places and preempt each other for nothing; ranked
by level (how many of the policy's thresholds the service has reached), a job keeps its place
until it crosses a threshold, and jobs of one level run first come, first served. Under
`OrderPolicy.FAIR_LAS` a queue's waiting jobs go by (priority, level, submit time, id), and a
waiting job may preempt a running job of its own queue at a strictly higher level; under the
other policies the level is always 0, so the key is the fair-share order's own.

Tiresias' starvation limit: a job that has waited since it last gave its GPUs back longer than
`SchedulerConfig.starvation_limit` times that run is promoted to the front of its queue's order
(ahead of every level, behind higher priorities), so a long job swapped out by level is not left
behind its queue's newer jobs for good. With `SchedulerConfig.promotion_resets_level`, as Tiresias
resets a promoted job to its top queue, a promoted job counts as level 0 for preemption both ways:
waiting, it may preempt a running job of its queue above level 0 (`waiting_level`), and once
started it is no level victim until it has attained one level's service since its promotion
(`running_level`, from `RunningJob.promoted_service`). With `SchedulerConfig.promotion_arrives` a
promoted job joins level 0 as if submitted at its promotion instead of leading its queue: where a
queue's short jobs outrun its share for weeks, every long job is promoted in turn, and ahead of
every level they would hold the queue's GPUs while its short jobs wait behind them. It depends on
the time, which the caller passes in.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Sequence

from corral.core.model import OrderPolicy, PendingJob, RunningJob, SchedulerConfig

InQueueKey = tuple[int, int, float, str]


def level(attained: float, thresholds: Sequence[float]) -> int:
    """How many of the sorted `thresholds` the attained service has reached (0: below the first)."""
    return bisect_right(thresholds, attained)


def thresholds_of(config: SchedulerConfig) -> tuple[float, ...]:
    """The thresholds the policy ranks by: none outside FAIR_LAS (every job at level 0)."""
    return config.las_thresholds if config.order is OrderPolicy.FAIR_LAS else ()


def service_read(config: SchedulerConfig) -> tuple[float, ...] | None:
    """What of a waiting job's attained service a cycle under `config` reads: all of it (None:
    LAS ranks and preempts by the exact value), its level (FAIR_LAS: the thresholds), or nothing
    (the other orders: `()`)."""
    return None if config.order is OrderPolicy.LAS else thresholds_of(config)


def service_class(attained: float, read: tuple[float, ...] | None) -> float:
    """The part of `attained` a cycle reads under `read` (`service_read`): equal values, equal answers."""
    if read is None:
        return attained
    return float(bisect_right(read, attained)) if read else 0.0


def in_queue_key(p: PendingJob, thresholds: Sequence[float], promoted: bool = False,
                 arrival: float | None = None) -> InQueueKey:
    """Highest priority first, then promoted jobs (level -1), the lowest level, the oldest, the id.
    `arrival` (`SchedulerConfig.promotion_arrives`): a promoted job is instead at level 0 as if
    submitted at `arrival`, its promotion time, unless its own key is ahead of that."""
    job = p.job
    if promoted and arrival is None:
        return (-job.priority, -1, job.submit_time, job.id)
    lv = bisect_right(thresholds, p.attained_gpu_seconds) if thresholds else 0
    key = (-job.priority, lv, job.submit_time, job.id)
    return min(key, (-job.priority, 0, arrival, job.id)) if promoted and arrival is not None else key


def starvation_limit(config: SchedulerConfig) -> float:
    """The multiple of its last run a job waits before promotion: 0 (never) outside FAIR_LAS."""
    return config.starvation_limit if config.order is OrderPolicy.FAIR_LAS else 0.0


def promote_at(p: PendingJob, limit: float) -> float:
    """When the starvation limit `limit` (`starvation_limit`) promotes `p`: its requeue time plus
    `limit` times its last run; never (inf) for a job that has not run or with the limit off."""
    if limit <= 0 or p.requeued_at is None or p.last_run_seconds <= 0:
        return math.inf
    return p.requeued_at + limit * p.last_run_seconds


def key_at(config: SchedulerConfig, now: float) -> Callable[[PendingJob], InQueueKey]:
    """The in-queue key of a cycle at `now` (the plain definition: promotion computed per job)."""
    thresholds = thresholds_of(config)
    limit = starvation_limit(config)
    if limit <= 0:
        return lambda p: in_queue_key(p, thresholds)
    if config.promotion_arrives:
        return lambda p: in_queue_key(p, thresholds, now >= promote_at(p, limit), promote_at(p, limit))
    return lambda p: in_queue_key(p, thresholds, now >= promote_at(p, limit))


def promoted_at(p: PendingJob, config: SchedulerConfig, now: float) -> bool:
    """Whether the starvation limit has promoted `p` by `now` (never outside FAIR_LAS)."""
    limit = starvation_limit(config)
    return limit > 0 and now >= promote_at(p, limit)


def resets_at(p: PendingJob, config: SchedulerConfig, now: float) -> bool:
    """Whether `p` counts as level 0 for preemption at `now` (promoted, and promotion resets the level)."""
    return config.promotion_resets_level and promoted_at(p, config, now)


def waiting_level(p: PendingJob, config: SchedulerConfig, now: float) -> int:
    """The level `p` preempts by at `now`: 0 once promoted (`resets_at`), else its attained service's."""
    if resets_at(p, config, now):
        return 0
    return level(p.attained_gpu_seconds, config.las_thresholds)


def running_level(r: RunningJob, thresholds: Sequence[float], now: float) -> int:
    """The level `r` is a victim at: of its service since its promotion if promoted, else of all of it."""
    attained = r.attained(now)
    if r.promoted_service is not None:
        attained -= r.promoted_service
    return level(attained, thresholds)


def started_promotion(p: PendingJob, config: SchedulerConfig, now: float) -> float | None:
    """`RunningJob.promoted_service` of `p` started at `now`: its attained service if promoted (`resets_at`),
    else None."""
    return p.attained_gpu_seconds if resets_at(p, config, now) else None
