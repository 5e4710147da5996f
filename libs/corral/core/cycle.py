"""One scheduling cycle: order, allocate (gang, all-or-nothing), backfill, preempt and reclaim.

Like Volcano's session, the cycle works on its own copy of the world (a `GpuLedger` and the queue
usage, from a `Prepared` input) and commits each job's outcome before looking at the next, so
later jobs see the GPUs and quota that earlier decisions took. `Cycle.decide(job)` runs these
steps in order; the first that answers wins:

1. strict policies (fifo/priority without backfill) stop at the first blocked job: ORDERED_BEHIND;
2. `_check_quota`: QUEUE_UNKNOWN / MAX_GPUS_EXCEEDED / QUOTA_EXCEEDED, unless in-queue preemption
   of lower-priority jobs frees that quota;
3. `_try_place` on free GPUs, avoiding a backfill reservation unless the job ends before it is
   needed (or is entitled by guarantee and the holder is not) -> Place (PLACED or BACKFILLED);
4. `_wait_for_releasing`: GPUs already being released by preempted jobs ->
   Pending(WAITING_FOR_PREEMPTION), and they are held for it;
5. `_try_preempt`: preemption / reclaim with simulated fit -> Preempt (the victims' GPUs are held
   for it);
6. `_explain_pending`: RESERVED_FOR, TOPOLOGY_UNSATISFIABLE / NO_MATCHING_GPU (never fits), or
   GANG_DOES_NOT_FIT, and the first such job gets the EASY backfill reservation.

The speed-ups (class answers, negative caches, early stop) are in `shortcuts`; the GPU books in
`ledger`; the victim rules in `preemption`; the wording of each answer in `reasons`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from corral.core import reasons
from corral.core.backfill import Release, Reservation, find_placement_avoiding, reserve
from corral.core.decisions import Decision, Pending, Place, Preempt, Reason, ReasonCode
from corral.core.gpuset import FreeGpus
from corral.core.ledger import GpuLedger
from corral.core.levels import level
from corral.core.model import Job, OrderPolicy, PendingJob, Placement, RunningJob, SchedulerConfig, Snapshot
from corral.core.placement import find_placement, idle_index, static_feasibility
from corral.core.preemption import Candidates, PreemptionPlan, plan_preemption
from corral.core.preemption.eligibility import NONE_SPARED
from corral.core.prepared import Prepared, prepare
from corral.core.quota import quota_check, within_guarantee
from corral.core.shortcuts import ClassMemo, EarlyStop, Shortcuts, WouldChange, shape


def schedule(
    snapshot: Snapshot,
    config: SchedulerConfig = SchedulerConfig(),
    *,
    explain: bool = True,
    memo: ClassMemo | None = None,
) -> list[Decision]:
    """One decision per pending job, in the order they were considered; pure and deterministic.

    `explain=False` returns only the actions (Place and Preempt), exactly those of the full
    cycle, and stops as soon as no job left in the order can get one (see `EarlyStop`). The
    simulator uses it; services that publish reasons do not. `memo`: the caller's `ClassMemo`,
    kept between calls so that unchanged PendingJob objects are classed once (a fresh one if None).
    """
    cycle = Cycle.of(snapshot, config, memo)
    return cycle.run() if explain else cycle.actions()


class Cycle:
    """One cycle over a `Prepared` input; `run()` or `actions()` once."""

    def __init__(self, prepared: Prepared, config: SchedulerConfig) -> None:
        self.prepared = prepared
        self.snapshot = prepared.snapshot
        self.config = config
        self.now = prepared.snapshot.now
        self.cluster = prepared.snapshot.cluster
        self.tree, self.usage = prepared.tree, prepared.usage
        self.gpus = GpuLedger(prepared.fi, prepared.releasing)
        self.candidates = Candidates(prepared.running, self.now, config, prepared.kept)
        self.fast = Shortcuts()
        self.placed: list[Release] = []  # backfill releases of the jobs placed this cycle
        self.reservation: Reservation | None = None
        # guaranteed jobs that do not fit: borrowers may not take the free GPUs they are owed
        self.starved = 0
        self.starved_for: Job | None = None
        self.strict = not config.backfill and config.order in (OrderPolicy.FIFO, OrderPolicy.PRIORITY)
        self.blocker: PendingJob | None = None  # strict: the first blocked job
        self.behind: Reason | None = None  # strict: the one answer of every job behind it

    @classmethod
    def of(cls, snapshot: Snapshot, config: SchedulerConfig, memo: ClassMemo | None = None) -> Cycle:
        """A cycle prepared from scratch from `snapshot`."""
        memo = memo if memo is not None else ClassMemo()
        memo.between_cycles()
        return cls(prepare(snapshot, config, memo), config)

    @property
    def fi(self) -> FreeGpus:
        return self.gpus.fi

    def order(self) -> Iterator[PendingJob]:
        return self.prepared.order(self.usage)

    def class_of(self, p: PendingJob) -> int | None:
        """The job's class (see `shortcuts.class_key`); None: decide it on its own."""
        return self.prepared.classes[p.job.id]

    # -- a whole cycle ----------------------------------------------------------------------------

    def run(self) -> list[Decision]:
        return [self.decide(p, self.class_of(p)) for p in self.order()]

    def actions(self) -> list[Decision]:
        """The Place and Preempt decisions of `run()`, without deciding jobs that cannot act."""
        if not self.strict:
            return EarlyStop(self).run()
        out: list[Decision] = []
        for p in self.order():  # the first blocked job stops the cycle: no classes needed
            d = self.decide(p, None)
            if self.blocker is not None:
                break
            if not isinstance(d, Pending):
                out.append(d)
        return out

    def probe(self, p: PendingJob, key: int) -> bool:
        """Decide `p` out of order without changing anything; True when its class's answer is now
        known for the current state (a Pending shared by the class). The answer is the one any
        job of the class would get at this state version, wherever it stands in the order."""
        if self.fast.shared_answer(key) is not None:
            return True
        starved, starved_for = self.starved, self.starved_for
        self.fast.dry = True
        try:
            self.decide(p, key)
        except WouldChange:
            return False
        finally:
            self.fast.dry = False
            self.starved, self.starved_for = starved, starved_for
        return self.fast.shared_answer(key) is not None

    # -- one job ----------------------------------------------------------------------------------

    def decide(self, p: PendingJob, key: int | None) -> Decision:
        """The job's decision. `key` is its class (`class_of`): while the state is unchanged, jobs
        of one class share a Pending answer; None: decide it on its own, share nothing."""
        if self.blocker is not None:
            return Pending(p.job.id, self._ordered_behind(self.blocker.job))
        shared = self.fast.shared_answer(key)
        if shared is not None:
            reason, starves = shared
            if starves:
                self._starve(p.job)
            if reasons.names_the_reservation(reason):  # names the job: the class's answer, reworded
                assert self.reservation is not None
                reason = reasons.reserved_for(p.job, self.reservation, self.now)
            elif reasons.owed_by_hold(reason) not in (None, self.starved):  # more jobs starved since
                held = self._held_for_guarantee(p)
                assert held is not None
                self.fast.remember(key, self.fast.version, held, starves)
                return held
            return Pending(p.job.id, reason)
        version, starved = self.fast.version, self.starved
        decision = self._decide(p)
        self.fast.remember(key, version, decision, self.starved != starved)
        return decision

    def _decide(self, p: PendingJob) -> Decision:
        """The steps, in order: the first that answers wins."""
        over_quota = self._check_quota(p)
        if over_quota is not None:
            return over_quota
        avoid = self.reservation is not None and not self._may_use_reserved(p)
        found = self._try_place(p, avoid)
        if isinstance(found, (Place, Pending)):
            return found
        return self._wait_for_releasing(p) or self._try_preempt(p, avoid) or self._explain_pending(p, avoid, found)

    def _check_quota(self, p: PendingJob) -> Decision | None:
        """Over quota: wait (QUEUE_UNKNOWN, MAX_GPUS_EXCEEDED, QUOTA_EXCEEDED), unless preempting
        lower-priority jobs of the same queue frees the quota. None: within quota."""
        job = p.job
        over = quota_check(self.snapshot, job, self.usage, tree=self.tree, quotas=self.config.quotas)
        if over is None:
            return None
        if over.code is not ReasonCode.QUEUE_UNKNOWN and self.config.preemption:
            plan = self._plan(p, lambda: self.candidates.same_queue(p), check_quota=True)
            if isinstance(plan, PreemptionPlan):
                return self._preempt(p, plan)
        return Pending(job.id, over)

    def _try_place(self, p: PendingJob, avoid: bool) -> Place | Pending | Reason | None:
        """Place on free GPUs (not on reserved ones when `avoid`): a Place, or a Pending when the
        GPUs are held for a starved guaranteed job; a Reason or None (known already) when it does
        not fit."""
        job = p.job
        key = (self.fast.shape_of(job), avoid)
        if key in self.fast.no_fit:
            return None
        found: Placement | Reason | None
        if avoid:
            assert self.reservation is not None
            found = find_placement_avoiding(self.fi, job, self.reservation)
        else:
            found = find_placement(self.cluster, self.fi, job)
        if not isinstance(found, Placement):
            self.fast.no_fit.add(key)  # free GPUs only shrink during a cycle: not later either
            return found
        held = self._held_for_guarantee(p)
        if held is not None:
            return held
        return self._place(p, found)

    def _wait_for_releasing(self, p: PendingJob) -> Pending | None:
        """If GPUs being released by preempted jobs make the job fit, hold them for it."""
        job = p.job
        if not self.gpus.releasing or self.fast.shape_of(job) in self.fast.no_release_fit:
            return None
        if self.fi.total_free + self.gpus.releasing_count() < job.total_gpus:
            return None
        found = self.gpus.fit_with_releasing(job)
        if found is None:
            self.fast.no_release_fit.add(self.fast.shape_of(job))
            return None
        self.fast.changing()
        coming, _ = self.gpus.claim(found)
        self._use(job)
        return Pending(job.id, reasons.waiting_for_preemption(job, coming))

    def _try_preempt(self, p: PendingJob, avoid: bool) -> Preempt | None:
        """Preempt or reclaim, when a plan makes the job provably fit."""
        if not (self.config.preemption or self.config.reclaim):
            return None
        idle = self.fi.total_free
        plan = self._plan(p, lambda: self.candidates.for_job(p, self.tree, self.usage, idle,
                                                                    self.snapshot.pending), check_quota=False,
                          avoid=avoid)
        return self._preempt(p, plan) if isinstance(plan, PreemptionPlan) else None

    def _explain_pending(self, p: PendingJob, avoid: bool, found: Reason | None) -> Pending:
        """Why the job waits: the reservation it would delay, never fitting, or not fitting now --
        and then a guaranteed job starves, and the first such job holds the backfill reservation
        (strict order: blocks everyone behind it)."""
        job = p.job
        if avoid:
            unmasked = self._unmasked(job)
            if isinstance(unmasked, Placement):
                assert self.reservation is not None
                return Pending(job.id, reasons.reserved_for(job, self.reservation, self.now))
            found = unmasked
        never = self._never(job)
        if never is not None:
            return Pending(job.id, never)
        reason = found if found is not None else self._no_fit(job)
        if job.queue in self.tree.configs:  # a configured queue: its fair-share state is part of why
            used, guaranteed = self.usage.held.get(job.queue, 0), self.tree.guarantee[job.queue]
            reason = self.fast.with_standing(reason, job.queue, used, guaranteed)
        if self.config.quotas and within_guarantee(self.tree, self.usage, job.queue, job.total_gpus):
            self._starve(job)
        if self.config.backfill and self.reservation is None:
            return Pending(job.id, self._reserve(job, reason))
        if self.strict:
            self.fast.changing()
            self.blocker = p
        return Pending(job.id, reason)

    # -- what the steps ask -----------------------------------------------------------------------

    def _ordered_behind(self, blocker: Job) -> Reason:
        """Strict order: nothing changes after the first blocked job, so one reason serves all."""
        if self.behind is None:
            self.behind = reasons.ordered_behind(blocker, self.config.order, self.fi.total_free)
        return self.behind

    def _may_use_reserved(self, p: PendingJob) -> bool:
        r = self.reservation
        assert r is not None
        if r.admits(p.job, self.now):
            return True
        return not r.holder_within_guarantee and within_guarantee(self.tree, self.usage, p.job.queue, p.job.total_gpus)

    def _held_for_guarantee(self, p: PendingJob) -> Pending | None:
        """A borrowing job may not take free GPUs that a starved guaranteed job is owed."""
        job = p.job
        if not self.starved or within_guarantee(self.tree, self.usage, job.queue, job.total_gpus):
            return None
        if self.fi.total_free - job.total_gpus >= self.starved:
            return None
        assert self.starved_for is not None
        return Pending(job.id, reasons.held_for_guarantee(job, self.starved, self.starved_for, self.fi.total_free))

    def _never(self, job: Job) -> Reason | None:
        """`static_feasibility` of the job's shape: a pure function of the cluster, so it is kept
        in the cluster's memo (with the idle index it needs) for every cycle on the same Cluster,
        and by shape number for this cycle."""
        n = self.fast.shape_of(job)
        if n in self.fast.never:
            found = self.fast.never[n]
        else:
            memo = self.cluster.memo
            key = ("static_feasibility", shape(job))
            if key not in memo:
                idle = memo.get("idle_index")
                if not isinstance(idle, FreeGpus):
                    idle = memo["idle_index"] = idle_index(self.cluster)
                memo[key] = static_feasibility(self.cluster, job, idle)
            found = self.fast.never[n] = memo[key]
        assert found is None or isinstance(found, Reason)
        return found

    def _no_fit(self, job: Job) -> Reason:
        """find_placement's Reason for a shape known not to fit, computed once per state version."""
        key = self.fast.shape_of(job)
        hit = self.fast.no_fit_reason.get(key)
        if hit is not None and hit[0] == self.fast.version:
            return hit[1]
        found = find_placement(self.cluster, self.fi, job)
        assert isinstance(found, Reason)
        self.fast.no_fit_reason[key] = (self.fast.version, found)
        return found

    def _unmasked(self, job: Job) -> Placement | Reason:
        """find_placement on every free GPU, reserved ones included, once per shape and state version."""
        key = self.fast.shape_of(job)
        hit = self.fast.unmasked.get(key)
        if hit is None or hit[0] != self.fast.version:
            hit = self.fast.unmasked[key] = (self.fast.version, find_placement(self.cluster, self.fi, job))
        found = hit[1]
        assert isinstance(found, (Placement, Reason))
        return found

    def _starve(self, job: Job) -> None:
        """A guaranteed job is starved: borrowers may not take the free GPUs it is owed."""
        self.starved += job.total_gpus
        if self.starved_for is None:
            self.starved_for = job

    def _plan(
        self, p: PendingJob, candidates_of: Callable[[], list[RunningJob]], *, check_quota: bool, avoid: bool = False
    ) -> PreemptionPlan | Reason | None:
        """A preemption plan for the job (victims not already taken; never the reserved GPUs when
        `avoid`). `candidates_of` is called only when the answer is not already known to be "no
        plan", except under LAS: there it is called first, because it answers "nobody" at once for
        most waiting jobs (`Candidates._las_may_find`), and the job's key is not built for them."""
        las = self.config.order is OrderPolicy.LAS
        candidates = candidates_of() if las else None
        if candidates is not None and not candidates:
            return None
        spared = self.prepared.spared.get(p.job.id, NONE_SPARED)
        service = float(level(p.attained_gpu_seconds, self.prepared.thresholds)) if self.prepared.thresholds else 0.0
        key = (self.fast.preempt_key(p, service=p.attained_gpu_seconds if las else service, spared=spared,
                                     check_quota=check_quota), avoid)
        if key in self.fast.no_preempt:
            return None
        if candidates is None:
            candidates = candidates_of()
        if not candidates:
            return None
        reserved = self.reservation.masks if avoid and self.reservation is not None else None
        with self.gpus.avoiding(reserved):
            plan = plan_preemption(
                self.snapshot, p, self.config, free=self.fi, tree=self.tree, usage=self.usage,
                candidates=candidates, taken=self.gpus.victims, check_quota=check_quota,
                releasing=self.gpus.releasing, presorted=True, explain=False, eligible=True,
            )
        if not isinstance(plan, PreemptionPlan):
            self.fast.no_preempt.add(key)
        return plan

    # -- commits: each changes the cycle's state ---------------------------------------------------

    def _use(self, job: Job) -> None:
        """Count the job's GPUs in its queues; a queue that now borrows may hold reclaimable jobs,
        so cached 'cannot preempt' answers are no longer valid."""
        self.fast.changing()
        self.usage.add(job.queue, job.total_gpus, user=job.user)
        if any(self.usage.active.get(q, 0) > self.tree.guarantee.get(q, 0) for q in self.tree.path(job.queue)):
            self.fast.borrow_epoch += 1

    def _place(self, p: PendingJob, placement: Placement) -> Place:
        job = p.job
        self.fast.changing()
        masks = self.gpus.take(placement)
        self._use(job)
        est = job.estimated_runtime_seconds
        self.placed.append(Release(math.inf if est is None else self.now + est, job.id, masks))
        return Place(job.id, placement, reasons.placed(job, placement, self.reservation))

    def _preempt(self, p: PendingJob, plan: PreemptionPlan) -> Preempt:
        """Commit a plan: the placement's GPUs are held for the preemptor (free ones taken now,
        releasing ones claimed); victims' GPUs it does not need join the releasing pool."""
        self.fast.changing()
        for v in plan.victims:
            self.usage.deactivate(v.job.queue, v.placement.gpu_count)
        _, grew = self.gpus.claim(plan.placement, plan.victims)
        if grew:
            self.fast.releasing_grew()
        self._use(p.job)
        return Preempt(p.job.id, plan.victim_ids, plan.reason)

    def _reserve(self, job: Job, reason: Reason) -> Reason:
        """EASY backfill: the first job that does not fit reserves where and when it will."""
        self.fast.changing()
        self.reservation = reserve(
            self.fi,
            job,
            self._releases(),
            self.gpus.claimed,
            holder_within_guarantee=within_guarantee(self.tree, self.usage, job.queue, job.total_gpus),
        )
        return reason if self.reservation is None else reasons.with_reservation(reason, self.reservation)

    def _releases(self) -> list[Release]:
        """When GPUs come back: jobs placed this cycle, running jobs (not victims) at their
        expected end, jobs asked to checkpoint and the releasing pool now."""
        out = list(self.placed)
        victims = self.gpus.victims
        kept = self.prepared.releases.values()
        out.extend(kept if not victims else (x for x in kept if x.job_id not in victims))
        for r in self.prepared.running:
            if r.preempting and r.job.id not in victims:
                out.append(Release(self.now, r.job.id, self.gpus.masks_of(r.placement)))
        if self.gpus.releasing:
            out.append(Release(self.now, "", tuple(sorted(self.gpus.releasing.items()))))
        return out
