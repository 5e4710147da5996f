"""EASY backfill: the first gang that cannot start gets a reservation; others may not delay it.

The reservation is where and when the blocked job would start if running jobs end at their
estimates: release them in order of expected end until the job fits (binary search over that
order, feasibility only grows), giving a shadow time and the exact GPUs it would use. A later job
may then start on reserved GPUs only if its own estimate ends it before the shadow time; a job
without an estimate may start only on GPUs the reservation does not need.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from corral.core.gpuset import FreeGpus, Statement, mask_of
from corral.core.model import Job, Placement
from corral.core.placement import find_placement


@dataclass(frozen=True, slots=True)
class Release:
    """GPUs expected to come free at `end` (math.inf when the holder has no estimate)."""

    end: float
    job_id: str
    masks: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Reservation:
    holder: str
    shadow_time: float
    masks: tuple[tuple[int, int], ...]
    gpus: int
    holder_within_guarantee: bool

    def admits(self, job: Job, now: float) -> bool:
        """Whether `job` may use the reserved GPUs: it is estimated to finish before they are needed."""
        est = job.estimated_runtime_seconds
        return est is not None and now + est <= self.shadow_time

    def describe(self, now: float) -> str:
        when = (
            "when running jobs without estimates end"
            if math.isinf(self.shadow_time)
            else (f"in {self.shadow_time - now:.0f} s")
        )
        return f"job {self.holder} holds a reservation of {self.gpus} GPUs, expected to start {when}"


def releases_of(placement: Placement, fi: FreeGpus) -> tuple[tuple[int, int], ...]:
    by_node: dict[int, int] = {}
    for rank in placement.ranks:
        i = fi.index_of[rank.node]
        by_node[i] = by_node.get(i, 0) | mask_of(rank.gpus)
    return tuple(sorted(by_node.items()))


def reserve(
    fi: FreeGpus,
    job: Job,
    releases: list[Release],
    claimed: dict[int, int],
    *,
    holder_within_guarantee: bool = False,
) -> Reservation | None:
    """The reservation for `job`, or None if it would not fit even after every release."""
    order = sorted(releases, key=lambda r: (r.end, r.job_id))

    def attempt(k: int) -> Placement | None:
        stmt = Statement(fi)
        try:
            for rel in order[:k]:
                for i, m in rel.masks:
                    give = m & ~fi.free[i] & ~claimed.get(i, 0) & fi.all_masks[i]
                    if give:
                        stmt.give(i, give)
            found = find_placement(fi.cluster, fi, job)
        finally:
            stmt.rollback()
        return found if isinstance(found, Placement) else None

    if not order or attempt(len(order)) is None:
        return None
    lo, hi = 1, len(order)
    while lo < hi:
        mid = (lo + hi) // 2
        if attempt(mid) is not None:
            hi = mid
        else:
            lo = mid + 1
    placement = attempt(lo)
    assert placement is not None
    return Reservation(
        job.id, order[lo - 1].end, releases_of(placement, fi), placement.gpu_count, holder_within_guarantee
    )


def find_placement_avoiding(fi: FreeGpus, job: Job, reservation: Reservation) -> Placement | None:
    """A placement that leaves every reserved GPU alone (the index is restored afterwards)."""
    stmt = Statement(fi)
    try:
        for i, m in reservation.masks:
            hold = m & fi.free[i]
            if hold:
                stmt.take(i, hold)
        found = find_placement(fi.cluster, fi, job)
    finally:
        stmt.rollback()
    return found if isinstance(found, Placement) else None
