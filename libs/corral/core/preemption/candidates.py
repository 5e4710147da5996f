"""Possible victims, cheapest first: per cycle (`Candidates`) and per plan (`VictimSequence`).

Why: listing victims is the costly part of preemption (O(running jobs) and a sort by lost
work), yet most cycles never look for victims and most plans need only the first few. So the
cycle's list is built on first use and filtered to those the victim rule (`eligibility`) can
accept for the job at hand; a plan then walks it lazily, applying the rule exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from operator import itemgetter

from corral.core.decisions import ReasonCode
from corral.core.levels import level, waiting_level
from corral.core.model import Job, OrderPolicy, PendingJob, RunningJob, SchedulerConfig
from corral.core.preemption.eligibility import (
    ReclaimCache,
    defragmenting,
    las_threshold,
    outserved,
    reclaims_by_whole_jobs,
    same_queue_outranks,
    statically_eligible,
    victim_kind,
)
from corral.core.quota import QueueTree, QueueUsage
from corral.core.running import RunningIndex

_FIRST = itemgetter(0)


def victim_cost_key(r: RunningJob, now: float) -> tuple[float, int, int, str]:
    """Cheapest victims first: least work lost, then lowest priority, then most GPUs freed."""
    return (r.lost_work(now), r.job.priority, -r.placement.gpu_count, r.job.id)


class Candidates:
    """One cycle's possible victims, cheapest first (costs are fixed for the cycle), built on
    first use: overall, per queue, and per LAS threshold. `running` is sorted by job id.

    `kept`: the same running jobs as an owner keeps them between cycles (`RunningIndex`); it
    answers the per-queue lowest priority, the most attained service and who may have a LAS
    threshold's service without a pass over every running job. None: computed from `running`."""

    def __init__(
        self, running: list[RunningJob], now: float, config: SchedulerConfig, kept: RunningIndex | None = None
    ) -> None:
        self.running, self.now, self.config, self.kept = running, now, config, kept
        self._eligible: list[RunningJob] | None = None
        self._by_queue: dict[str, list[RunningJob]] = {}  # `in_queue`'s lists
        self._running_by_queue: dict[str, list[RunningJob]] | None = None
        self._attained: list[tuple[RunningJob, float]] | None = None
        self._lowest = None if kept is None else kept.lowest_priority()
        self._las: dict[tuple[float, str, int] | tuple[float, str, int, int], list[RunningJob]] = {}
        self._most_attained = None if kept is None else kept.most_attained_bound(now)
        self._facts: dict[str, tuple[bool, float, tuple[float, int, int, str]]] = {}  # `_las_kept`'s
        self._top_level: dict[str, int] | None = None  # FAIR_LAS: per queue, its running jobs' highest level
        self._kept_top: dict[str, int] = {}  # FAIR_LAS: per queue, the level of the kept index's bound (-1: none)

    @property
    def eligible(self) -> list[RunningJob]:
        """Running jobs that may be victims this cycle, cheapest first."""
        if self._eligible is None:
            now, config = self.now, self.config
            costed = [(victim_cost_key(r, now), r) for r in self.running if statically_eligible(r, now, config)]
            costed.sort(key=_FIRST)
            self._eligible = [r for _, r in costed]
            by_queue: dict[str, list[RunningJob]] = {}
            for r in self._eligible:
                by_queue.setdefault(r.job.queue, []).append(r)
            self._by_queue = by_queue
        return self._eligible

    def in_queue(self, queue: str) -> list[RunningJob]:
        """`eligible`'s jobs of one queue, in its order (the cost key is unique: a queue's jobs
        sorted alone are in the order the whole list has them); only that queue's jobs costed
        while the whole list is not needed."""
        found = self._by_queue.get(queue)
        if found is None:
            if self._eligible is not None:
                return []
            if self._running_by_queue is None:
                grouped: dict[str, list[RunningJob]] = {}
                for r in self.running:
                    grouped.setdefault(r.job.queue, []).append(r)
                self._running_by_queue = grouped
            now, config = self.now, self.config
            costed = [(victim_cost_key(r, now), r) for r in self._running_by_queue.get(queue, ())
                      if statically_eligible(r, now, config)]
            costed.sort(key=_FIRST)
            found = self._by_queue[queue] = [r for _, r in costed]
        return found

    def for_job(self, p: PendingJob, tree: QueueTree, usage: QueueUsage, idle: int | None = None,
                waiting: Iterable[PendingJob] = ()) -> list[RunningJob]:
        """Running jobs worth examining: everyone when LAS, reclaim or a move may apply, else the
        queue's. A move needs (`eligibility.defragmenting`) the job's GPUs idle (`idle`: at least
        the idle GPUs the plan gets; None: unknown) and no other queue among the `waiting` jobs."""
        job, config = p.job, self.config
        if config.order is OrderPolicy.LAS and config.preemption:
            return self.eligible if config.reclaim else self._las_for(p)
        if defragmenting(config, job, idle, waiting):
            return self.eligible
        if config.reclaim and config.quotas and tree.known(job.queue):
            held, owed = usage.active.get(job.queue, 0), tree.guarantee[job.queue]
            if held < owed if reclaims_by_whole_jobs(config) else held + job.total_gpus <= owed:
                return self.eligible
        return self.same_queue(p) if config.preemption else []

    def _las_for(self, p: PendingJob) -> list[RunningJob]:
        """Only those the LAS rule can accept: far more attained service, or lower priority in
        the same queue (filtering here keeps the cost order and the answer). One list per
        (threshold, queue, priority) a cycle: every new job (no service yet) of a queue shares it."""
        job = p.job
        need = las_threshold(self.config, p.attained_gpu_seconds)
        need -= 1e-6 * (1.0 + abs(need))  # a superset: `victim_kind` decides exactly, rounding aside
        key = (need, job.queue, job.priority)
        found = self._las.get(key)
        if found is None and not self._las_may_find(need, job):
            found = self._las[key] = []  # what the filter below would find, without the cost order
        if found is None:
            found = self._las_kept(need, job)
            found = self._las[key] = found if found is not None else self._las_filter(need, job)
        return found

    def _las_filter(self, need: float, job: Job) -> list[RunningJob]:
        if self._attained is None:
            self._attained = [(r, r.attained(self.now)) for r in self.eligible]
        # `same_queue_outranks`, inlined: this list is rebuilt per job and threshold under LAS
        q, prio = job.queue, job.priority
        return [r for r, theirs in self._attained if theirs >= need or (r.job.queue == q and r.job.priority < prio)]

    def _las_kept(self, need: float, job: Job) -> list[RunningJob] | None:
        """`_las_for`'s filter from the kept index, when only attained service can qualify (nobody
        of lower priority runs in the job's queue): the few that may have `need` service, checked
        exactly and put in cost order -- the eligible ones in cost order, filtered, without
        costing every running job. None: not answerable so (no index, or lower priorities run)."""
        low = self._lowest_priority().get(job.queue)
        if self.kept is None or (low is not None and low < job.priority):
            return None
        now, config = self.now, self.config
        maybe = self.kept.attained_at_least(need, now)
        if maybe is None:
            return None
        # a running job's eligibility, cost and service are fixed for the cycle, and the jobs with
        # much service qualify for most thresholds: each is worked out once a cycle
        facts = self._facts
        costed = []
        for r in maybe:
            known = facts.get(r.job.id)
            if known is None:
                eligible = statically_eligible(r, now, config)
                known = facts[r.job.id] = (eligible, r.attained(now), victim_cost_key(r, now))
            if known[0] and known[1] >= need:
                costed.append((known[2], r))
        costed.sort(key=_FIRST)
        return [r for _, r in costed]

    def _las_may_find(self, need: float, job: Job) -> bool:
        """False when `_las_for`'s filter provably keeps nobody: no running job (eligible or not)
        has `need` attained service (an upper bound on the most of it answers as well), and none
        in the job's queue runs at a lower priority. Most waiting jobs under LAS were preempted
        before and have much service: no one qualifies."""
        if self._most_attained is None:
            now = self.now
            self._most_attained = max((r.attained(now) for r in self.running), default=-math.inf)
        if self._most_attained >= need:
            return True
        low = self._lowest_priority().get(job.queue)
        return low is not None and low < job.priority

    def _lowest_priority(self) -> dict[str, int]:
        """Per queue: the lowest priority of its running jobs (eligible or not)."""
        if self._lowest is None:
            self._lowest = {}
            for r in self.running:
                q, prio = r.job.queue, r.job.priority
                if prio < self._lowest.get(q, prio + 1):
                    self._lowest[q] = prio
        return self._lowest

    def same_queue(self, p: PendingJob) -> list[RunningJob]:
        """Possible victims in the job's own queue, cheapest first. Outside LAS a same-queue victim
        can only be one of lower priority or, under FAIR_LAS, of a higher service level (reclaim is
        between queues), so the others are left out, and when the queue runs nobody such the
        victims' cost order is not built."""
        job, config = p.job, self.config
        if config.order is OrderPolicy.LAS:
            return self.in_queue(job.queue)
        low = self._lowest_priority().get(job.queue)
        lower = low is not None and low < job.priority
        if config.order is OrderPolicy.FAIR_LAS:
            mine = waiting_level(p, config, self.now)
            if self._may_outserve(job.queue, mine):
                return self._outserving(p, mine)
        if not lower:
            return []
        return [r for r in self.in_queue(job.queue) if same_queue_outranks(job, r.job)]

    def _outserving(self, p: PendingJob, mine: int) -> list[RunningJob]:
        """FAIR_LAS: the job's queue's victims of lower priority or a higher level (and no more
        GPUs), cheapest first; one list per (queue, priority, level, GPUs) a cycle (the filter
        reads nothing else)."""
        job, now, config = p.job, self.now, self.config
        key = (float(mine), job.queue, job.priority, job.total_gpus)
        found = self._las.get(key)
        if found is None:
            found = self._las[key] = [r for r in self.in_queue(job.queue)
                                      if same_queue_outranks(job, r.job) or outserved(config, p, r, now)]
        return found

    def _may_outserve(self, queue: str, mine: int) -> bool:
        """FAIR_LAS: whether a running job of `queue` (eligible or not) may be above level `mine`
        (True may be a false alarm: the caller filters exactly). From the kept index's bound on
        the queue's most attained service, else each running job's level, worked out once a cycle."""
        th = self.config.las_thresholds
        if self.kept is not None:
            top = self._kept_top.get(queue)
            if top is None:
                bound = self.kept.most_attained_bound(self.now, queue)
                top = self._kept_top[queue] = -1 if bound is None else level(bound, th)
            if top >= 0:
                return top > mine
        if self._top_level is None:
            now = self.now
            levels: dict[str, int] = {}
            for r in self.running:
                lv = level(r.attained(now), th)
                if lv > levels.get(r.job.queue, -1):
                    levels[r.job.queue] = lv
            self._top_level = levels
        return self._top_level.get(queue, -1) > mine


class VictimSequence:
    """One plan's eligible victims in cost order, built lazily: most plans need only the first
    few, and eligibility of a reclaim victim depends on the ones before it (its queue must still
    borrow)."""

    def __init__(
        self,
        now: float,
        config: SchedulerConfig,
        tree: QueueTree,
        usage: QueueUsage,
        pending: PendingJob,
        ordered: list[RunningJob],
        eligible: bool = False,
        defragment: bool = False,
    ):
        """`eligible`: every job in `ordered` is `statically_eligible` at `now` (a `Candidates` list);
        `defragment`: jobs may be moved for the waiting one (`eligibility.victim_kind`)."""
        self.now, self.config, self.tree, self.eligible = now, config, tree, eligible
        self.defragment = defragment
        self.work = usage.copy()
        self.pending = pending
        self.ordered = ordered
        self.pos = 0
        self.items: list[RunningJob] = []
        self.kinds: dict[str, ReasonCode] = {}
        self.gpus = 0
        self.cache = ReclaimCache(tree, self.work, pending.job, reclaims_by_whole_jobs(config))

    def extend(self, k: int) -> bool:
        """Grow to at least k victims; False when fewer exist."""
        while len(self.items) < k and self.pos < len(self.ordered):
            r = self.ordered[self.pos]
            self.pos += 1
            kind = victim_kind(self.now, self.config, self.tree, self.work, self.pending, r, self.cache, self.eligible,
                               self.defragment)
            if kind is None:
                continue
            self.items.append(r)
            self.kinds[r.job.id] = kind
            self.gpus += r.placement.gpu_count
            if kind is ReasonCode.RECLAIMED_FOR_GUARANTEE:
                self.work.deactivate(r.job.queue, r.placement.gpu_count)
                self.cache.forget_entitlement()  # a shared ancestor's usage may have dropped
        return len(self.items) >= k

    @property
    def exhausted(self) -> bool:
        return self.pos >= len(self.ordered)
