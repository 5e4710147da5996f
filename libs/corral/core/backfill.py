"""EASY backfill: the first gang that cannot start gets a reservation; others may not delay it.

The reservation is where and when the blocked job would start if running jobs end at their
estimates: release them in order of expected end until the job fits (binary search over that
order, feasibility only grows), giving a shadow time and the exact GPUs it would use. A later job
may then start on reserved GPUs only if its own estimate ends it before the shadow time; a job
without an estimate may start only on GPUs the reservation does not need.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from corral.core.gpuset import FreeGpus, Statement
from corral.core.ledger import give_back
from corral.core.model import Job, Placement
from corral.core.placement import find_placement


class Release(NamedTuple):
    """GPUs expected to come free at `end` (math.inf when the holder has no estimate).

    A tuple, not a dataclass: a cycle that computes a reservation makes one per running job."""

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
    """(node index, GPU mask) per node of `placement`, sorted by node index."""
    return fi.masks_of(placement)


def reserve(
    fi: FreeGpus,
    job: Job,
    releases: list[Release],
    claimed: dict[int, int],
    *,
    holder_within_guarantee: bool = False,
) -> Reservation | None:
    """The reservation for `job`, or None if it would not fit even after every release."""
    order = sorted(releases)  # by (end, job_id): ids are unique, so the masks are never compared
    # One journal for the whole search: moving from one prefix of `order` to another only gives
    # or takes back the releases in between (rollback_to a mark).
    stmt = Statement(fi)
    marks: list[int] = []

    def to_prefix(k: int) -> None:
        if k < len(marks):
            stmt.rollback_to(marks[k])
            del marks[k:]
        while len(marks) < k:
            marks.append(stmt.mark())
            give_back(stmt, ((i, m & ~claimed.get(i, 0)) for i, m in order[len(marks) - 1].masks))

    def attempt(k: int) -> Placement | None:
        to_prefix(k)
        found = find_placement(fi.cluster, fi, job)
        return found if isinstance(found, Placement) else None

    # The shortest prefix after which the job fits (feasibility only grows with the prefix): no
    # prefix can fit before the released GPUs add up to the job's size; from there, gallop
    # (1, 2, 4, ... releases further) to a prefix that fits, then bisect. Most reservations
    # need a few releases out of hundreds, so this touches few of them.
    if not order:
        return None
    lo = _count_bound(fi, job.total_gpus, order, claimed)  # prefixes shorter than lo cannot fit
    if lo is None:
        return None
    try:
        hi = _shortest_prefix(attempt, lo, len(order))
        if hi is None:
            return None
        placement = attempt(hi)
    finally:
        stmt.rollback()
    assert placement is not None
    return Reservation(
        job.id, order[hi - 1].end, releases_of(placement, fi), placement.gpu_count, holder_within_guarantee
    )


def _shortest_prefix(attempt: Callable[[int], Placement | None], lo: int, n: int) -> int | None:
    """The shortest prefix length (of n) that `attempt` fits, knowing none shorter than `lo` does:
    gallop then bisect. None: not even all n."""
    hi, step = lo if lo > 0 else 1, 1
    while attempt(hi) is None:
        if hi == n:
            return None
        lo = hi  # from here on: prefixes of length <= lo are known not to fit
        hi = min(n, hi + step)
        step *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if attempt(mid) is not None:
            hi = mid
        else:
            lo = mid
    return hi


def _count_bound(fi: FreeGpus, need: int, order: list[Release], claimed: dict[int, int]) -> int | None:
    """The shortest prefix of `order` whose GPUs (with the free ones) add up to `need`; None: none."""
    have = fi.total_free
    lo = 0
    while lo < len(order) and have < need:
        for i, m in order[lo].masks:
            have += (m & ~fi.free[i] & ~claimed.get(i, 0) & fi.all_masks[i]).bit_count()
        lo += 1
    return lo if have >= need else None


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
