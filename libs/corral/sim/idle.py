"""Where a schedule leaves GPUs idle, and how long each gang class waits: from the job records alone.

Idle GPU-seconds (capacity minus GPUs held, over the makespan) fall in the first of these that
holds at each instant, judged on the idle GPUs as the records place them:
- `nothing_waiting`: no job waits;
- `held`: a waiting job fits on the idle GPUs as they lie, and its queue is under its ceiling
  (the GPUs are kept for someone: a backfill reservation for a gang, a starved guarantee);
- `quota_ceilings`: a waiting job would fit, but every such job's queue is at its `max_gpus`;
- `fragmentation`: a waiting job needs no more GPUs than are idle, but they lie scattered
  (too few on one node for a job of one node, too few whole free nodes for a gang);
- `gangs_larger_than_idle`: every waiting job needs more GPUs than are idle (the cluster drains
  for the next big gang, or nothing fits at all).
A job of one replica needs that many idle GPUs on one node; a gang of R replicas of G GPUs needs R
nodes with G idle GPUs each (Philly's gangs are whole 8-GPU nodes).

The utilisation bound: the most any schedule of the same jobs can reach without losing work to
preemption (`utilisation_bound`): their GPU-seconds over the capacity times the shortest makespan
possible, which is no shorter than any job's submit time plus its duration, nor than the fluid
drain (for every submit time s, s plus the GPU-seconds submitted at or after s over the capacity).
What a schedule leaves idle below it is the arrivals' (nothing to run); above it, the schedule's.

Gang classes: jobs by GPU count rounded up to a power of two (1, 2, 4, 8, 16, ...); a class's
wait is the mean of first start - submit over its started jobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from corral.core import Cluster, QueueConfig
from corral.sim.records import JobRecord

CATEGORIES = ("nothing_waiting", "held", "quota_ceilings", "fragmentation", "gangs_larger_than_idle")


@dataclass(frozen=True, slots=True)
class IdleBreakdown:
    """Idle GPU-seconds per category (`CATEGORIES`) and the capacity's GPU-seconds they are part of."""

    seconds: dict[str, float]
    capacity_gpu_seconds: float

    def share(self, category: str) -> float:
        return self.seconds[category] / self.capacity_gpu_seconds if self.capacity_gpu_seconds else 0.0

    def to_json(self) -> dict[str, float]:
        return {c: self.share(c) for c in CATEGORIES}


def gang_class(gpus: int) -> int:
    """The GPU count rounded up to a power of two."""
    return 1 << max(0, gpus - 1).bit_length()


def gang_waits(records: Sequence[JobRecord]) -> dict[int, tuple[int, float]]:
    """Gang class -> (started jobs, mean wait in seconds), by class."""
    sums: dict[int, list[float]] = {}
    for r in records:
        if r.start is not None:
            acc = sums.setdefault(gang_class(r.gpus), [0, 0.0])
            acc[0] += 1
            acc[1] += r.start - r.submit
    return {c: (int(n), total / n) for c, (n, total) in sorted(sums.items())}


def utilisation_bound(records: Sequence[JobRecord], capacity: int) -> float:
    """The utilisation no schedule of `records`' jobs exceeds without losing work (module docstring)."""
    if not records or capacity <= 0:
        return 0.0
    work = sum(r.gpus * r.duration for r in records)
    makespan = max(r.submit + r.duration for r in records)
    later = 0.0  # GPU-seconds submitted at or after the current submit time
    for r in sorted(records, key=lambda r: r.submit, reverse=True):
        later += r.gpus * r.duration
        makespan = max(makespan, r.submit + later / capacity)
    return work / (capacity * makespan) if makespan > 0 else 0.0


def idle_breakdown(records: Sequence[JobRecord], cluster: Cluster, queues: Sequence[QueueConfig]) -> IdleBreakdown:
    """The idle GPU-seconds of the schedule in `records`, by category (module docstring). A job
    waits from its submission to its first placement and between placements (requeued)."""
    ceiling = {q.name: q.max_gpus for q in queues if q.max_gpus is not None}
    # (time, placement ends before submissions before starts, job, -1 submit / 2n start / 2n+1 end of placement n)
    events: list[tuple[float, int, int, int]] = []
    for i, r in enumerate(records):
        events.append((r.submit, 1, i, -1))
        for n, p in enumerate(r.placements):
            events.append((p.start, 2, i, 2 * n))
            events.append((p.end, 0, i, 2 * n + 1))
    events.sort()
    free = {node.name: node.gpu_count for node in cluster.nodes}
    held: dict[str, int] = {}
    shapes: dict[tuple[int, int, str], int] = {}  # waiting jobs per (replicas, GPUs per replica, queue)
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    total_free = cluster.total_gpus
    last = events[0][0] if events else 0.0
    for t, _, i, what in events:
        if t > last and total_free > 0:
            seconds[_category(shapes, free, total_free, held, ceiling)] += (t - last) * total_free
        last = t
        r = records[i]
        shape = (r.replicas, r.gpus_per_replica, r.queue)
        if what < 0 or (what % 2 == 1 and what // 2 < len(r.placements) - 1):
            shapes[shape] = shapes.get(shape, 0) + 1  # submitted, or requeued
        if what < 0:
            continue
        if what % 2 == 0:
            shapes[shape] -= 1
            if not shapes[shape]:
                del shapes[shape]
        sign = -1 if what % 2 == 0 else 1
        p = r.placements[what // 2]
        for rank in p.ranks:
            free[rank.node] += sign * len(rank.gpus)
        total_free += sign * p.gpu_count
        held[r.queue] = held.get(r.queue, 0) - sign * p.gpu_count
    return IdleBreakdown(seconds, cluster.total_gpus * last)


def _category(
    shapes: dict[tuple[int, int, str], int],
    free: dict[str, int],
    total_free: int,
    held: dict[str, int],
    ceiling: dict[str, int],
) -> str:
    if not shapes:
        return "nothing_waiting"
    counts = sorted(free.values(), reverse=True)
    fits_capped = smaller = False
    for replicas, per, queue in shapes:
        if replicas * per > total_free:
            continue
        smaller = True
        if len(counts) >= replicas and counts[replicas - 1] >= per:
            cap = ceiling.get(queue)
            if cap is None or held.get(queue, 0) + replicas * per <= cap:
                return "held"
            fits_capped = True
    if fits_capped:
        return "quota_ceilings"
    return "fragmentation" if smaller else "gangs_larger_than_idle"
