"""VictimSearch: the cheapest victim set after which one pending job provably fits.

Why: trying every subset of victims is exponential; trying prefixes of the cost order one
by one re-simulates the placement hundreds of times. The search takes victims in cost order
(least lost work first) and finds the shortest prefix that fits -- no prefix can fit before its
GPUs add up to the job's size; from there it gallops (1, 2, 4, ... victims further) then bisects,
all on one journal of the index (releases are undone with `Statement.rollback_to`) -- then drops
victims that are not needed, most expensive first, and prefers a single cheaper victim when one
suffices. Every "fits" is a placement simulated on the index plus a quota re-check.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.core.decisions import Reason, ReasonCode
from corral.core.fitcount import fits_with
from corral.core.gpuset import FreeGpus, Statement
from corral.core.ledger import Masks, give_back
from corral.core.model import PendingJob, Placement, RunningJob, SchedulerConfig, Snapshot
from corral.core.placement import fits_now, placement_or_none
from corral.core.preemption.candidates import VictimSequence
from corral.core.quota import QueueTree, QueueUsage, quota_check

_SINGLETON_TRIES = 32
_PRUNE_AT_MOST = 64
_ALL_FIRST_AT_MOST = 64  # `all_may_fit` tries the whole list first when it is no longer
# no set of victims fits, for a caller that drops the reason (`explain=False`)
_UNEXPLAINED = Reason(ReasonCode.GANG_DOES_NOT_FIT, "no set of victims makes it fit", ())


class VictimSearch:
    """One search; `run()` once. `fi` is left exactly as it was found."""

    def __init__(
        self,
        snapshot: Snapshot,
        pending: PendingJob,
        config: SchedulerConfig,
        fi: FreeGpus,
        tree: QueueTree,
        usage: QueueUsage,
        seq: VictimSequence,
        check_quota: bool,
        explain: bool = True,
    ) -> None:
        """`explain=False`: the caller drops the Reason when no set fits (the cycle does), so it
        is not worded, and the victims it would count are not all examined."""
        self.snapshot, self.pending, self.config = snapshot, pending, config
        self.fi, self.tree, self.usage, self.seq = fi, tree, usage, seq
        self.check_quota, self.explain = check_quota, explain
        self.job = pending.job
        self.now = snapshot.now
        self._masks: dict[str, Masks] = {}
        # the journal of the prefix search: `released` victims given back, a mark before each
        self.stmt = Statement(fi)
        self.marks: list[int] = []
        self.released = 0

    def run(self) -> tuple[list[RunningJob], Placement] | Reason:
        """The victims (cheapest set found) and where the job runs once they are gone, or why not."""
        hi = self.shortest_prefix()
        if isinstance(hi, Reason):
            return hi
        if hi == 0:
            return Reason(
                ReasonCode.GANG_DOES_NOT_FIT,
                f"needs {self.job.shape}; it fits without preemption, on GPUs held for another job",
                (("needs_gpus", self.job.total_gpus), ("eligible_victims", 0)),
            )
        chosen = self.single_cheaper(self.prune(self.seq.items[:hi]))
        placement = self.fits(chosen, build=True)
        assert isinstance(placement, Placement)
        return chosen, placement

    # -- the shortest prefix of the cost order that fits -------------------------------------------

    def shortest_prefix(self) -> int | Reason:
        try:
            if not self.candidates_may_fit():
                return self.no_fit()
            k = self.count_bound()
            if k is None or not self.all_may_fit():
                return self.no_fit()
            lo, hi = self.gallop(k)
            if hi < 0:
                return self.no_fit()
            return self.bisect(lo, hi)
        finally:
            self.stmt.rollback()

    def count_bound(self) -> int | None:
        """The shortest prefix whose GPUs (with the free ones) add up to the job's; None: none does."""
        seq, need = self.seq, self.job.total_gpus
        k = 0
        have = self.fi.total_free
        while have < need:
            if not seq.extend(k + 1):
                return None
            have += seq.items[k].placement.gpu_count
            k += 1
        return k

    def candidates_may_fit(self) -> bool:
        """False when the job would not fit even if every candidate were gone, victim or not (a
        superset of the victims, so exact: fitting only grows with the GPUs freed). Answered from
        the free counts (`fits_with`), before any candidate is examined by the victim rule, for
        short lists without a hard gang level; True otherwise (the search decides)."""
        ordered = self.seq.ordered
        if len(ordered) > _ALL_FIRST_AT_MOST:
            return True
        gained: dict[int, int] = {}
        for r in ordered:
            for i, m in self.masks(r):
                gained[i] = gained.get(i, 0) | m
        return fits_with(self.fi, self.job, gained) is not False

    def all_may_fit(self) -> bool:
        """False when the job does not fit even once every victim is gone. Most plans under LAS
        fail so, and galloping to the end of a short list takes several placements where this
        takes one. Exact: fitting only grows with the prefix (more free GPUs, less quota used), so
        the gallop ends without a fit exactly when the whole list does not fit. Long lists (reclaim
        over every running job) are left to the gallop: most of them fit early."""
        seq = self.seq
        if len(seq.ordered) > _ALL_FIRST_AT_MOST:
            return True
        seq.extend(len(seq.ordered))
        return self.prefix_fits(len(seq.items))

    def gallop(self, k: int) -> tuple[int, int]:
        """From prefix k, 1, 2, 4, ... victims further until one fits: (lo, hi) with prefixes of
        length <= lo known not to fit and hi fitting (-1: none does)."""
        seq = self.seq
        lo, step = k - 1, 1
        while True:
            if self.prefix_fits(k):
                return lo, k
            lo = k
            seq.extend(k + step)
            if k >= len(seq.items):
                return lo, -1
            k = min(len(seq.items), k + step)
            step *= 2

    def bisect(self, lo: int, hi: int) -> int:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.prefix_fits(mid):
                hi = mid
            else:
                lo = mid
        return hi

    def prefix_fits(self, k: int) -> bool:
        self.to_prefix(k)
        return self.quota_ok(self.seq.items[:k]) and fits_now(self.fi, self.job)

    def to_prefix(self, k: int) -> None:
        """Move the journal to "the first k victims released"."""
        if k < self.released:
            self.stmt.rollback_to(self.marks[k])
            del self.marks[k:]
            self.released = k
        while self.released < k:
            self.marks.append(self.stmt.mark())
            give_back(self.stmt, self.masks(self.seq.items[self.released]))
            self.released += 1

    def no_fit(self) -> Reason:
        seq, job = self.seq, self.job
        if not self.explain:
            return _UNEXPLAINED
        seq.extend(len(seq.ordered))
        return Reason(
            ReasonCode.GANG_DOES_NOT_FIT,
            f"needs {job.shape}; even preempting all {len(seq.items)} eligible jobs "
            f"({seq.gpus} GPUs) would not make it fit",
            (("needs_gpus", job.total_gpus), ("eligible_victims", len(seq.items)), ("freeable_gpus", seq.gpus)),
        )

    # -- cheaper sets ---------------------------------------------------------------------------------

    def prune(self, chosen: list[RunningJob]) -> list[RunningJob]:
        """Drop the most expensive victims that are not needed."""
        if len(chosen) > _PRUNE_AT_MOST:
            return chosen
        now = self.now
        for v in sorted(chosen, key=lambda r: (-r.lost_work(now), r.job.id)):
            if len(chosen) > 1:
                trial = [c for c in chosen if c is not v]
                if self.fits(trial):
                    chosen = trial
        return chosen

    def single_cheaper(self, chosen: list[RunningJob]) -> list[RunningJob]:
        """One victim that suffices and costs less than `chosen`, if any of the first few does."""
        best = self.cost(chosen)
        self.seq.extend(_SINGLETON_TRIES)
        for r in self.seq.items[:_SINGLETON_TRIES]:
            if self.cost([r]) >= best:
                break
            if self.fits([r]):
                return [r]
        return chosen

    def cost(self, victims: Sequence[RunningJob]) -> tuple[float, int]:
        return (sum(v.lost_work(self.now) for v in victims), len(victims))

    # -- one trial --------------------------------------------------------------------------------------

    def fits(self, victims: Sequence[RunningJob], *, build: bool = False) -> Placement | bool:
        """Whether the job fits once `victims` are gone (simulated, rolled back); with `build`,
        where it runs then (the Placement; False when it does not fit)."""
        fi = self.fi
        if fi.total_free + sum(v.placement.gpu_count for v in victims) < self.job.total_gpus:
            return False
        if not self.quota_ok(victims):
            return False
        stmt = Statement(fi)
        try:
            for v in victims:
                give_back(stmt, self.masks(v))
            if not build:
                return fits_now(fi, self.job)
            found = placement_or_none(fi, self.job)
            return False if found is None else found
        finally:
            stmt.rollback()

    def quota_ok(self, victims: Sequence[RunningJob]) -> bool:
        """Removing victims never makes quota worse, so the caller may skip this (`check_quota`)."""
        if not self.check_quota:
            return True
        after = self.usage.copy()
        for v in victims:
            after.add(v.job.queue, -v.placement.gpu_count, active=not v.preempting, user=v.job.user)
        return quota_check(self.snapshot, self.job, after, tree=self.tree, quotas=self.config.quotas) is None

    def masks(self, r: RunningJob) -> Masks:
        m = self._masks.get(r.job.id)
        if m is None:
            m = self._masks[r.job.id] = self.fi.masks_of(r.placement)
        return m
