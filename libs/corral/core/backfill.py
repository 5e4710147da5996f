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

from corral.core.fitcount import Headroom
from corral.core.gpuset import FreeGpus, Statement
from corral.core.ledger import Masks, give_back
from corral.core.model import Job, Placement
from corral.core.placement import find_placement, fits_now, placement_or_none

# the cluster memo's table of reservation placements (`_placed_memo`), cleared when this full
_PLACED = "reservation placements"
_PLACED_AT_MOST = 20_000


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

    def attempt(k: int) -> bool:
        to_prefix(k)
        return fits_now(fi, job)

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
        if job.topology.gang is None:  # the counts answer each prefix: one pass, no index moves
            counted = _counted_prefix(fi, job, order, claimed, lo)
            if counted is None:
                return None
            hi, room = counted
            masks, gpus = _placed_memo(fi, job, room, lambda: _placed(to_prefix, hi, fi, job))
        else:
            found = _shortest_prefix(attempt, lo, len(order))
            if found is None:
                return None
            hi = found
            masks, gpus = _placed(to_prefix, hi, fi, job)
    finally:
        stmt.rollback()
    return Reservation(job.id, order[hi - 1].end, masks, gpus, holder_within_guarantee)


def _placed(to_prefix: Callable[[int], None], k: int, fi: FreeGpus, job: Job) -> tuple[Masks, int]:
    """Where the job would start once the first k releases are back: its GPUs per node, and how many."""
    to_prefix(k)
    placement = find_placement(fi.cluster, fi, job)
    assert isinstance(placement, Placement)
    return releases_of(placement, fi), placement.gpu_count


def _placed_memo(
    fi: FreeGpus, job: Job, room: Headroom, place: Callable[[], tuple[Masks, int]]
) -> tuple[Masks, int]:
    """`place()`, remembered in the cluster's memo by the job's shape and the free GPUs it places
    on (those of `fi` with the released ones, which `room` holds): placement is a pure function
    of them, and a replay reserves for the same shape on the same GPUs again and again (the next
    cycle only added a waiting job: ~60 % of Corral's reservations on the first 10,000 Philly
    jobs). The key: which nodes are eligible (`fi.static`), the job's `shortcuts.shape`, the GPUs."""
    free = list(fi.free)
    for i, m in room.now.items():
        free[i] = m
    memo = fi.cluster.memo.setdefault(_PLACED, {})
    assert isinstance(memo, dict)
    key = (id(fi.static), job.replicas, job.gpus_per_replica, job.topology, job.gpu, tuple(free))
    found = memo.get(key)
    if found is None:
        if len(memo) >= _PLACED_AT_MOST:
            memo.clear()
        found = memo[key] = place()
    return found


def _shortest_prefix(attempt: Callable[[int], bool], lo: int, n: int) -> int | None:
    """The shortest prefix length (of n) that `attempt` fits, knowing none shorter than `lo` does:
    gallop then bisect. None: not even all n."""
    hi, step = lo if lo > 0 else 1, 1
    while not attempt(hi):
        if hi == n:
            return None
        lo = hi  # from here on: prefixes of length <= lo are known not to fit
        hi = min(n, hi + step)
        step *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if attempt(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _counted_prefix(
    fi: FreeGpus, job: Job, order: list[Release], claimed: dict[int, int], lo: int
) -> tuple[int, Headroom] | None:
    """`_shortest_prefix` for a job without a hard gang level, from the counts (`Headroom`): the
    releases are added one by one and the first prefix (of at least `lo`, and at least one
    release, as the gallop starts) after which the job fits is the shortest, since fitting only
    grows with the prefix; with the counts after it. None: not even all of them."""
    room = Headroom(fi, job)
    start = max(lo, 1)
    for k, release in enumerate(order, start=1):
        for i, m in release.masks:
            room.add(i, m & ~claimed.get(i, 0))
        if k >= start and room.fits():
            return k, room
    return None


def _count_bound(fi: FreeGpus, need: int, order: list[Release], claimed: dict[int, int]) -> int | None:
    """The shortest prefix of `order` whose GPUs (with the free ones) add up to `need`; None: none."""
    have = fi.total_free
    lo = 0
    while lo < len(order) and have < need:
        for i, m in order[lo].masks:
            have += (m & ~fi.free[i] & ~claimed.get(i, 0) & fi.usable_masks[i]).bit_count()
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
        return placement_or_none(fi, job)
    finally:
        stmt.rollback()
