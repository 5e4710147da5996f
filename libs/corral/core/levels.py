"""Attained service in discrete levels, as Tiresias' 2D-LAS has it, and the order inside a queue.

A job's attained service is GPUs x seconds it has run (all attempts). Ranked by the exact value,
two jobs that differ by a few GPU-seconds swap places and preempt each other for nothing; ranked
by level (how many of the policy's thresholds the service has reached), a job keeps its place
until it crosses a threshold, and jobs of one level run first come, first served. Under
`OrderPolicy.FAIR_LAS` a queue's waiting jobs go by (priority, level, submit time, id), and a
waiting job may preempt a running job of its own queue at a strictly higher level; under the
other policies the level is always 0, so the key is the fair-share order's own.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from corral.core.model import OrderPolicy, PendingJob, SchedulerConfig

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


def in_queue_key(p: PendingJob, thresholds: Sequence[float]) -> InQueueKey:
    """Highest priority first, then the lowest level, then the oldest, then the id."""
    job = p.job
    lv = bisect_right(thresholds, p.attained_gpu_seconds) if thresholds else 0
    return (-job.priority, lv, job.submit_time, job.id)
