"""One scheduling cycle: order, allocate (gang, all-or-nothing), backfill, preempt and reclaim.

Like Volcano's session, the cycle works on its own copy of the world (a FreeGpus index and the
queue usage) and commits each job's outcome before looking at the next, so later jobs see the
GPUs and quota that earlier decisions took. For each pending job, in order:

1. strict policies (fifo/priority without backfill) stop at the first blocked job: ORDERED_BEHIND;
2. quota (QUEUE_UNKNOWN / MAX_GPUS_EXCEEDED / QUOTA_EXCEEDED), unless in-queue preemption of
   lower-priority jobs frees that quota;
3. placement on free GPUs, avoiding a backfill reservation unless the job ends before it is needed
   (or is entitled by guarantee and the holder is not) -> Place (PLACED or BACKFILLED);
4. GPUs already being released by preempted jobs -> Pending(WAITING_FOR_PREEMPTION), and they are
   held for it;
5. preemption / reclaim with simulated fit -> Preempt (the victims' GPUs are held for it);
6. otherwise Pending: RESERVED_FOR, TOPOLOGY_UNSATISFIABLE / NO_MATCHING_GPU (never fits), or
   GANG_DOES_NOT_FIT, and the first such job gets the EASY backfill reservation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from operator import attrgetter, itemgetter

from corral.core.backfill import Release, Reservation, find_placement_avoiding, releases_of, reserve
from corral.core.decisions import Decision, Pending, Place, Preempt, Reason, ReasonCode
from corral.core.gpuset import FreeGpus, Statement
from corral.core.model import (
    Job,
    OrderPolicy,
    PendingJob,
    Placement,
    RunningJob,
    SchedulerConfig,
    Snapshot,
)
from corral.core.ordering import iter_pending, tree_for
from corral.core.placement import find_placement, idle_index, static_feasibility
from corral.core.preemption import PreemptionPlan, plan_preemption, statically_eligible, victim_cost_key
from corral.core.quota import QueueTree, QueueUsage, quota_check, within_guarantee


def schedule(
    snapshot: Snapshot, config: SchedulerConfig = SchedulerConfig(), *, explain: bool = True
) -> list[Decision]:
    """One decision per pending job, in the order they were considered; pure and deterministic.

    `explain=False` returns only the actions (Place and Preempt), exactly those of the full
    cycle, and stops as soon as no job left in the order can get one: every remaining job
    belongs to a class (see `_Cycle._class_of`) that already got its Pending answer since the
    cycle's state last changed. The simulator uses it; services that publish reasons do not.
    """
    if len(_CLASS_OF) > 200_000:  # between cycles only: ids are compared within one cycle
        _CLASS_OF.clear()
        _CLASS_IDS.clear()
    cycle = _Cycle(snapshot, config)
    return cycle.run() if explain else cycle.actions()


class _WouldChange(Exception):
    """A probe (a dry decision, see `_Cycle.probe`) reached a step that would change the cycle's state."""


# how many jobs in a row must leave the state unchanged before `actions` probes the other classes
_QUIET_BEFORE_PROBING = 8

# reasons that name the job itself or record GPUs held for it: never shared with other jobs
_PER_JOB_REASONS = frozenset({ReasonCode.RESERVED_FOR, ReasonCode.WAITING_FOR_PREEMPTION})


_BY_ID = attrgetter("job.id")
_FIRST = itemgetter(0)
_CLASS_IDS: dict[tuple[object, ...], int] = {}
_CLASS_OF: dict[int, tuple[PendingJob, int]] = {}


def class_key(p: PendingJob) -> tuple[object, ...]:
    """Everything about a pending job that its decision reads, except its id and its place in the
    order: jobs with equal keys get equal answers while the cycle's state is unchanged."""
    job = p.job
    return (
        job.queue,
        job.replicas,
        job.gpus_per_replica,
        job.topology,
        job.gpu,
        job.priority,
        job.estimated_runtime_seconds,
        p.preempted_by,
        p.attained_gpu_seconds,
    )


def class_id(p: PendingJob) -> int:
    """A small int naming the pending job's class; equal for jobs whose decisions read the same.

    A memo of a pure function: the engine and the services keep their PendingJob objects from
    cycle to cycle, so the key (whose Topology and GpuRequest hash in Python, not C) is built
    and hashed once per job instead of once per job per cycle. Entries keep their PendingJob
    alive, so an id() is never reused while it is in the table. Ids are only compared within
    one cycle, so clearing the tables between cycles is harmless.
    """
    hit = _CLASS_OF.get(id(p))
    if hit is not None and hit[0] is p:
        return hit[1]
    key = class_key(p)
    n = _CLASS_IDS.get(key)
    if n is None:
        n = _CLASS_IDS[key] = len(_CLASS_IDS)
    _CLASS_OF[id(p)] = (p, n)
    return n


def _shape(job: Job) -> tuple[object, ...]:
    """What placement depends on: jobs of equal shape fit (or not) on the same free GPUs."""
    return (job.replicas, job.gpus_per_replica, job.topology, job.gpu)


@dataclass(slots=True)
class Prepared:
    """What a cycle would otherwise derive from its snapshot, kept up to date between cycles by a
    `SchedulerState` (see state.py). Each part equals its from-scratch value for the snapshot;
    `usage` and `fi` are fresh copies the cycle may change.

    order: the pending jobs in the policy's order (lazily); classes: every pending job's class id
    (numbered by the state; numbers are only compared within one cycle); live and sample: the
    classes in order of their first job in `snapshot.pending`, with their job counts and that
    first job (None when the state leaves them to the cycle: some pending job is a preemptor)."""

    tree: QueueTree
    usage: QueueUsage
    fi: FreeGpus
    running: list[RunningJob]
    releasing: dict[int, int]
    preemptors: set[str]
    order: Callable[[QueueUsage], Iterator[PendingJob]]
    classes: dict[str, int]
    live: dict[int | None, int] | None
    sample: dict[int, PendingJob] | None
    # the backfill release of every running job not asked to checkpoint, by job id (any order)
    releases: dict[str, Release]


class _Cycle:
    def __init__(self, snapshot: Snapshot, config: SchedulerConfig, prepared: Prepared | None = None):
        self.snapshot = snapshot
        self.config = config
        self.now = snapshot.now
        self.cluster = snapshot.cluster
        self.prepared = prepared
        # GPUs of jobs asked to checkpoint: still taken in the index, free soon, claimable once
        self.releasing: dict[int, int]
        if prepared is not None:
            self.tree, self.usage, self.fi = prepared.tree, prepared.usage, prepared.fi
            self.running = prepared.running
            self.releasing = prepared.releasing
            # jobs that already preempted someone still running: their answers are their own
            self.preemptors: set[str] = prepared.preemptors
        else:
            ids = [p.job.id for p in snapshot.pending] + [r.job.id for r in snapshot.running]
            if len(set(ids)) != len(ids):
                dup = sorted({i for i in ids if ids.count(i) > 1})
                raise ValueError(f"Snapshot: job ids must be unique across pending and running, repeated: {dup}")
            self.tree = tree_for(snapshot, config)
            self.usage = QueueUsage.of(self.tree, snapshot.running)
            self.fi = FreeGpus.from_running(self.cluster, snapshot.running)
            self.running = sorted(snapshot.running, key=_BY_ID)
            self.releasing = {}
            for r in self.running:
                if r.preempting:
                    for i, m in releases_of(r.placement, self.fi):
                        self.releasing[i] = self.releasing.get(i, 0) | m
            self.preemptors = {x for r in self.running for x in r.preempted_by}
        # possible victims, cheapest first, overall and per queue: built on first use (most
        # cycles of a replay never look for victims)
        self._eligible: list[RunningJob] | None = None
        self._by_queue: dict[str, list[RunningJob]] = {}
        self._eligible_attained: list[tuple[RunningJob, float]] | None = None
        self._lowest: dict[str, int] | None = None  # per queue: the lowest priority running
        self._las_candidates: dict[tuple[float, str, int], list[RunningJob]] = {}
        self.claimed: dict[int, int] = {}
        self.victims: set[str] = set()
        self.placed: list[Release] = []
        self.reservation: Reservation | None = None
        self.blocker: PendingJob | None = None
        # negative caches, valid for the whole cycle because free GPUs, releasing GPUs and
        # preemption candidates only shrink while it runs (see `_preempt_key` for the exception)
        self.no_fit: set[tuple[object, bool]] = set()
        # why a shape does not fit the free GPUs, valid while `version` is unchanged
        self.no_fit_reason: dict[object, tuple[int, Reason]] = {}
        self.no_release_fit: set[object] = set()
        self.no_preempt: set[object] = set()
        self.borrow_epoch = 0
        self.starved = 0
        self.starved_for: Job | None = None
        self.release_epoch = 0
        self.strict = not config.backfill and config.order in (OrderPolicy.FIFO, OrderPolicy.PRIORITY)
        self.behind: Reason | None = None
        # Jobs of one class (see `_class_of`) get the same Pending answer as long as the cycle's
        # committed state (free GPUs, usage, claims, victims, reservation) has not changed since
        # the first of them was decided. `version` counts those changes; a busy cycle decides
        # ~1,000 waiting jobs of a few classes, and this makes all but the first of each O(1).
        self.version = 0
        self.classes: dict[int, tuple[int, Reason, bool]] = {}
        self.dry = False  # while probing a class out of order (see `actions`): change nothing

    @property
    def eligible(self) -> list[RunningJob]:
        """Running jobs that may be victims this cycle, cheapest first (costs are fixed for it)."""
        if self._eligible is None:
            now = self.now
            costed = [(victim_cost_key(r, now), r) for r in self.running if statically_eligible(r, now, self.config)]
            costed.sort(key=_FIRST)
            self._eligible = [r for _, r in costed]
            for r in self._eligible:
                self._by_queue.setdefault(r.job.queue, []).append(r)
        return self._eligible

    def _attained(self) -> list[tuple[RunningJob, float]]:
        """`eligible` with each job's attained service now (LAS asks for it once per candidate)."""
        if self._eligible_attained is None:
            now = self.now
            self._eligible_attained = [(r, r.attained(now)) for r in self.eligible]
        return self._eligible_attained

    @property
    def by_queue(self) -> dict[str, list[RunningJob]]:
        """`eligible`, per queue."""
        if self._eligible is None:
            _ = self.eligible
        return self._by_queue

    def order(self) -> Iterator[PendingJob]:
        if self.prepared is not None:
            return self.prepared.order(self.usage)
        return iter_pending(self.snapshot, self.config, tree=self.tree, usage=self.usage)

    def run(self) -> list[Decision]:
        return [self.decide(p, self._class_of(p)) for p in self.order()]

    def actions(self) -> list[Decision]:
        """The Place and Preempt decisions of `run()`, without deciding jobs that cannot act.

        Live classes are those with jobs still ahead in the order; `resolved` holds the live
        classes answered Pending at the current state version. When every live class is resolved
        (and no job without a class is left), the rest of the order would only repeat answers.
        A class is resolved by its first job in the order, or earlier by a probe: once the state
        has not changed for a while, each unresolved class is decided once out of order, dry
        (see `probe`); the classes of over-share queues, last in the fair-share order, are
        resolved without walking every job ahead of them.
        """
        out: list[Decision] = []
        if self.strict:  # the first blocked job stops the cycle: no classes needed
            for p in self.order():
                d = self.decide(p, None)
                if self.blocker is not None:
                    break
                if not isinstance(d, Pending):
                    out.append(d)
            return out
        prepared = self.prepared
        live: dict[int | None, int]
        sample: dict[int, PendingJob]
        if prepared is not None and prepared.live is not None and prepared.sample is not None:
            live, sample = prepared.live, prepared.sample
        else:
            live, sample = {}, {}
            for p in self.snapshot.pending:
                k = self._class_of(p)
                live[k] = live.get(k, 0) + 1
                if k is not None and k not in sample:
                    sample[k] = p
        resolved: set[int] = set()
        seen = self.version
        quiet = 0  # jobs decided since the state last changed
        probed = -1  # the version the probes last ran at
        for p in self.order():
            if self.blocker is not None:
                break  # strict order: everything behind the blocked job waits
            if self.version != seen:
                resolved.clear()
                seen, quiet = self.version, 0
            if quiet >= _QUIET_BEFORE_PROBING and probed != seen and None not in live:
                probed = seen
                for k in live:
                    if k not in resolved and k is not None and self.probe(sample[k], k):
                        resolved.add(k)
                    elif k not in resolved:
                        break
            if len(resolved) == len(live) and None not in live:
                break
            k = self._class_of(p)
            d = self.decide(p, k)
            quiet += 1
            if not isinstance(d, Pending):
                out.append(d)
            left = live[k] - 1
            if left:
                live[k] = left
            else:
                del live[k]
                if k is not None:
                    resolved.discard(k)
            if self.version != seen:
                resolved.clear()
                seen, quiet = self.version, 0
            elif left and k is not None:
                hit = self.classes.get(k)
                if hit is not None and hit[0] == seen:
                    resolved.add(k)
        return out

    def probe(self, p: PendingJob, key: int) -> bool:
        """Decide `p` out of order without changing anything; True when its class's answer is now
        known for the current state (a Pending shared by the class). The answer is the one any
        job of the class would get at this state version, wherever it stands in the order."""
        hit = self.classes.get(key)
        if hit is not None and hit[0] == self.version:
            return True
        starved, starved_for = self.starved, self.starved_for
        self.dry = True
        try:
            self.decide(p, key)
        except _WouldChange:
            return False
        finally:
            self.dry = False
            self.starved, self.starved_for = starved, starved_for
        hit = self.classes.get(key)
        return hit is not None and hit[0] == self.version

    # -- one job ----------------------------------------------------------------------------------

    def decide(self, p: PendingJob, key: int | None) -> Decision:
        """`key` is the job's class (`_class_of`); None: decide it on its own, share nothing."""
        if self.blocker is not None:
            # strict order: nothing changes after the first blocked job, so one reason serves all
            if self.behind is None:
                b = self.blocker.job
                self.behind = Reason(
                    ReasonCode.ORDERED_BEHIND,
                    f"behind job {b.id} in {self.config.order.value} order; it needs {b.total_gpus} GPUs "
                    f"and {self.fi.total_free} are free",
                    (("blocked_by", b.id), ("needs_gpus", b.total_gpus), ("free_gpus", self.fi.total_free)),
                )
            return Pending(p.job.id, self.behind)
        if key is not None:
            hit = self.classes.get(key)
            if hit is not None and hit[0] == self.version:
                if hit[2]:
                    self._starve(p.job)
                return Pending(p.job.id, hit[1])
        version, starved = self.version, self.starved
        decision = self._decide(p)
        if (
            key is not None
            and isinstance(decision, Pending)
            and self.version == version
            and decision.reason.code not in _PER_JOB_REASONS
        ):
            self.classes[key] = (version, decision.reason, self.starved != starved)
        return decision

    def _class_of(self, p: PendingJob) -> int | None:
        """The job's class: everything about a pending job that its decision reads, except its id
        and its place in the order (as a small int, see `class_id`); None for a job that earlier
        preempted a running one (its answers are its own)."""
        if p.job.id in self.preemptors:
            return None
        if self.prepared is not None:
            return self.prepared.classes[p.job.id]
        return class_id(p)

    def _starve(self, job: Job) -> None:
        """A guaranteed job is starved: borrowers may not take the free GPUs it is owed."""
        self.starved += job.total_gpus
        if self.starved_for is None:
            self.starved_for = job

    def _decide(self, p: PendingJob) -> Decision:
        job = p.job
        quota = quota_check(self.snapshot, job, self.usage, tree=self.tree, quotas=self.config.quotas)
        if quota is not None:
            if quota.code is not ReasonCode.QUEUE_UNKNOWN and self.config.preemption:
                plan = self._plan(p, lambda: self._same_queue_victims(job), check_quota=True)
                if isinstance(plan, PreemptionPlan):
                    return self._preempt(p, plan)
            return Pending(job.id, quota)

        avoid = self.reservation is not None and not self._may_use_reserved(p)
        shape = _shape(job)
        found: Placement | Reason | None = None
        if (shape, avoid) not in self.no_fit:
            if avoid:
                assert self.reservation is not None
                found = find_placement_avoiding(self.fi, job, self.reservation)
            else:
                found = find_placement(self.cluster, self.fi, job)
            if isinstance(found, Placement):
                held = self._held_for_guarantee(p)
                if self.dry:
                    raise _WouldChange
                return held if held is not None else self._place(p, found)
            # free GPUs only shrink during a cycle: the same shape cannot fit later either
            self.no_fit.add((shape, avoid))

        waiting = self._claim_releasing(p)
        if waiting is not None:
            return waiting

        if self.config.preemption or self.config.reclaim:
            plan = self._plan(p, lambda: self._candidates(p), check_quota=False, avoid=avoid)
            if isinstance(plan, PreemptionPlan):
                return self._preempt(p, plan)

        if avoid:
            assert self.reservation is not None
            unmasked = find_placement(self.cluster, self.fi, job)
            if isinstance(unmasked, Placement):
                r = self.reservation
                return Pending(
                    job.id,
                    Reason(
                        ReasonCode.RESERVED_FOR,
                        r.describe(self.now) + f"; starting {job.id} now would delay it",
                        (
                            ("reserved_for", r.holder),
                            ("reserved_gpus", r.gpus),
                            ("shadow_time", r.shadow_time),
                        ),
                    ),
                )
            found = unmasked
        never = self._never(job, shape)
        if never is not None:
            return Pending(job.id, never)
        reason = found if isinstance(found, Reason) else self._no_fit(job, shape)
        assert isinstance(reason, Reason)
        if self.config.quotas and within_guarantee(self.tree, self.usage, job.queue, job.total_gpus):
            self._starve(job)
        if self.config.backfill and self.reservation is None:
            if self.dry:
                raise _WouldChange
            self.version += 1
            self.reservation = reserve(
                self.fi,
                job,
                self._releases(),
                self.claimed,
                holder_within_guarantee=within_guarantee(self.tree, self.usage, job.queue, job.total_gpus),
            )
            if self.reservation is not None:
                r = self.reservation
                reason = Reason(
                    reason.code,
                    reason.message
                    + f"; holds a reservation of {r.gpus} GPUs"
                    + ("" if math.isinf(r.shadow_time) else f" from t={r.shadow_time:.0f}"),
                    (*reason.details, ("reserved_gpus", r.gpus), ("shadow_time", r.shadow_time)),
                )
        elif self.strict:
            if self.dry:
                raise _WouldChange
            self.version += 1
            self.blocker = p
        return Pending(job.id, reason)

    # -- helpers ----------------------------------------------------------------------------------

    def _never(self, job: Job, shape: object) -> Reason | None:
        """`static_feasibility` of the shape: a pure function of the cluster, so it is kept in the
        cluster's memo (with the idle index it needs) for every cycle on the same Cluster."""
        memo = self.cluster.memo
        key = ("static_feasibility", shape)
        if key not in memo:
            idle = memo.get("idle_index")
            if not isinstance(idle, FreeGpus):
                idle = memo["idle_index"] = idle_index(self.cluster)
            memo[key] = static_feasibility(self.cluster, job, idle)
        found = memo[key]
        assert found is None or isinstance(found, Reason)
        return found

    def _no_fit(self, job: Job, shape: object) -> Reason | Placement:
        """find_placement's Reason for a shape known not to fit, computed once per state version."""
        hit = self.no_fit_reason.get(shape)
        if hit is not None and hit[0] == self.version:
            return hit[1]
        found = find_placement(self.cluster, self.fi, job)
        if isinstance(found, Reason):
            self.no_fit_reason[shape] = (self.version, found)
        return found

    def _may_use_reserved(self, p: PendingJob) -> bool:
        r = self.reservation
        assert r is not None
        if r.admits(p.job, self.now):
            return True
        return not r.holder_within_guarantee and within_guarantee(self.tree, self.usage, p.job.queue, p.job.total_gpus)

    def _held_for_guarantee(self, p: PendingJob) -> Pending | None:
        """A borrowing job may not take free GPUs that a starved guaranteed job is owed."""
        if not self.starved or within_guarantee(self.tree, self.usage, p.job.queue, p.job.total_gpus):
            return None
        if self.fi.total_free - p.job.total_gpus >= self.starved:
            return None
        s = self.starved_for
        assert s is not None
        return Pending(
            p.job.id,
            Reason(
                ReasonCode.RESERVED_FOR,
                f"{min(self.starved, self.fi.total_free)} free GPUs are held for guaranteed jobs "
                f"(first: {s.id} of queue {s.queue}); queue {p.job.queue} would borrow them",
                (("reserved_for", s.id), ("reserved_gpus", self.starved)),
            ),
        )

    def _use(self, job: Job) -> None:
        """Count the job's GPUs in its queues; a queue that now borrows may hold reclaimable jobs,
        so cached 'cannot preempt' answers are no longer valid."""
        self.version += 1
        self.usage.add(job.queue, job.total_gpus)
        if any(self.usage.active.get(q, 0) > self.tree.guarantee.get(q, 0) for q in self.tree.path(job.queue)):
            self.borrow_epoch += 1

    def _take(self, placement: Placement) -> None:
        self.version += 1
        for i, m in releases_of(placement, self.fi):
            self.fi.take(i, m)

    def _place(self, p: PendingJob, placement: Placement) -> Place:
        job = p.job
        self._take(placement)
        self._use(job)
        est = job.estimated_runtime_seconds
        self.placed.append(
            Release(math.inf if est is None else self.now + est, job.id, releases_of(placement, self.fi))
        )
        nodes = placement.nodes()
        if self.reservation is not None:
            code, how = ReasonCode.BACKFILLED, f"backfilled without delaying job {self.reservation.holder}"
        else:
            code, how = ReasonCode.PLACED, "placed"
        return Place(
            job.id,
            placement,
            Reason(
                code,
                f"{how}: {job.shape} on {len(nodes)} node(s)",
                (("gpus", job.total_gpus), ("nodes", len(nodes))),
            ),
        )

    def _claim_releasing(self, p: PendingJob) -> Pending | None:
        """If GPUs being released by preempted jobs make the job fit, hold them for it."""
        if not self.releasing:
            return None
        job = p.job
        if _shape(job) in self.no_release_fit:
            return None
        if self.fi.total_free + sum(m.bit_count() for m in self.releasing.values()) < job.total_gpus:
            return None
        stmt = Statement(self.fi)
        try:
            for i, m in self.releasing.items():
                stmt.give(i, m)
            found = find_placement(self.cluster, self.fi, job)
        finally:
            stmt.rollback()
        if not isinstance(found, Placement):
            self.no_release_fit.add(_shape(job))
            return None
        if self.dry:
            raise _WouldChange
        coming = 0
        self.version += 1
        for i, m in releases_of(found, self.fi):
            from_release = m & self.releasing.get(i, 0)
            if from_release:
                coming += from_release.bit_count()
                self.releasing[i] &= ~from_release
                if not self.releasing[i]:
                    del self.releasing[i]
                self.claimed[i] = self.claimed.get(i, 0) | from_release
            if m & ~from_release:
                self.fi.take(i, m & ~from_release)
        self._use(job)
        return Pending(
            job.id,
            Reason(
                ReasonCode.WAITING_FOR_PREEMPTION,
                f"waiting for {coming} GPUs that preempted jobs are releasing; {job.total_gpus - coming} "
                "free GPUs are held for it",
                (("releasing_gpus", coming), ("held_gpus", job.total_gpus - coming)),
            ),
        )

    def _candidates(self, p: PendingJob) -> list[RunningJob]:
        """Running jobs worth examining: everyone when LAS or reclaim may apply, else the queue's."""
        job = p.job
        if self.config.order is OrderPolicy.LAS and self.config.preemption:
            if self.config.reclaim:
                return self.eligible
            # only those `preemption._kind` can accept: far more attained service, or lower
            # priority in the same queue (filtering here keeps the cost order and the answer)
            mine = p.attained_gpu_seconds
            need = max(self.config.las_preemption_ratio * mine, mine + self.config.las_min_gap_gpu_seconds)
            need -= 1e-6 * (1.0 + abs(need))  # a superset: `_kind` decides exactly, rounding aside
            # one list per (threshold, queue, priority) a cycle: every new job (no service yet)
            # of a queue shares it
            key = (need, job.queue, job.priority)
            found = self._las_candidates.get(key)
            if found is None:
                found = self._las_candidates[key] = [
                    r
                    for r, theirs in self._attained()
                    if theirs >= need or (r.job.queue == job.queue and r.job.priority < job.priority)
                ]
            return found
        if (
            self.config.reclaim
            and self.config.quotas
            and self.tree.known(job.queue)
            and self.usage.active.get(job.queue, 0) + job.total_gpus <= self.tree.guarantee[job.queue]
        ):
            return self.eligible
        return self._same_queue_victims(job) if self.config.preemption else []

    def _same_queue_victims(self, job: Job) -> list[RunningJob]:
        """Possible victims in the job's own queue, cheapest first. Outside LAS a same-queue victim
        can only be one of lower priority (reclaim is between queues), so the others are left out,
        and when the queue runs nothing of lower priority the victims' cost order is not built."""
        if self.config.order is OrderPolicy.LAS:
            return self.by_queue.get(job.queue, [])
        if self._lowest is None:
            self._lowest = {}
            for r in self.running:
                q, prio = r.job.queue, r.job.priority
                if prio < self._lowest.get(q, prio + 1):
                    self._lowest[q] = prio
        low = self._lowest.get(job.queue)
        if low is None or low >= job.priority:
            return []
        return [r for r in self.by_queue.get(job.queue, []) if r.job.priority < job.priority]

    def _preempt_key(self, p: PendingJob, check_quota: bool) -> object:
        """Jobs with equal keys get equal preemption answers until a borrower grows: placing a
        job in a queue over its guarantee can make that queue's older jobs reclaimable."""
        job = p.job
        attained = p.attained_gpu_seconds if self.config.order is OrderPolicy.LAS else 0.0
        return (
            _shape(job),
            job.queue,
            job.priority,
            p.preempted_by,
            job.id if job.id in self.preemptors else "",
            attained,
            check_quota,
            self.borrow_epoch,
            self.release_epoch,
        )

    def _plan(
        self,
        p: PendingJob,
        candidates_of: Callable[[], list[RunningJob]],
        *,
        check_quota: bool,
        avoid: bool = False,
    ) -> PreemptionPlan | Reason | None:
        """`candidates_of` is called only when the answer is not already known to be "no plan"
        (listing the candidates is O(running jobs) under LAS)."""
        key = (self._preempt_key(p, check_quota), avoid)
        if key in self.no_preempt:
            return None
        candidates = candidates_of()
        if not candidates:
            return None
        hold = Statement(self.fi)
        if avoid:  # preempting must not take the reserved GPUs either
            assert self.reservation is not None
            for i, m in self.reservation.masks:
                if m & self.fi.free[i]:
                    hold.take(i, m & self.fi.free[i])
        try:
            plan = self._plan_on_index(p, candidates, check_quota)
        finally:
            hold.rollback()
        if not isinstance(plan, PreemptionPlan):
            self.no_preempt.add(key)
        return plan

    def _plan_on_index(
        self, p: PendingJob, candidates: list[RunningJob], check_quota: bool
    ) -> PreemptionPlan | Reason | None:
        return plan_preemption(
            self.snapshot,
            p,
            self.config,
            free=self.fi,
            tree=self.tree,
            usage=self.usage,
            candidates=candidates,
            taken=self.victims,
            check_quota=check_quota,
            releasing=self.releasing,
            presorted=True,
        )

    def _preempt(self, p: PendingJob, plan: PreemptionPlan) -> Preempt:
        """Commit a plan: the placement's GPUs are held for the preemptor (free ones taken now,
        releasing ones claimed); victims' GPUs it does not need join the releasing pool."""
        if self.dry:
            raise _WouldChange
        job = p.job
        self.version += 1
        victim_gpus: dict[int, int] = {}
        for v in plan.victims:
            self.victims.add(v.job.id)
            self.usage.deactivate(v.job.queue, v.placement.gpu_count)
            for i, m in releases_of(v.placement, self.fi):
                victim_gpus[i] = victim_gpus.get(i, 0) | m
        for i, m in releases_of(plan.placement, self.fi):
            from_victims = m & victim_gpus.get(i, 0)
            from_release = m & self.releasing.get(i, 0)
            if from_victims:
                victim_gpus[i] &= ~from_victims
            if from_victims | from_release:
                self.claimed[i] = self.claimed.get(i, 0) | from_victims | from_release
            if from_release:
                self.releasing[i] &= ~from_release
                if not self.releasing[i]:
                    del self.releasing[i]
            hold = m & ~from_victims & ~from_release
            if hold:
                self.fi.take(i, hold)
        spare = {i: m for i, m in victim_gpus.items() if m}
        if spare:
            for i, m in spare.items():
                self.releasing[i] = self.releasing.get(i, 0) | m
            self.release_epoch += 1
            self.no_release_fit.clear()
        self._use(job)
        return Preempt(job.id, plan.victim_ids, plan.reason)

    def _releases(self) -> list[Release]:
        out = list(self.placed)
        victims = self.victims
        running = self.running
        if self.prepared is not None:
            kept = self.prepared.releases.values()
            out.extend(kept if not victims else (x for x in kept if x.job_id not in victims))
            running = [r for r in running if r.preempting]  # the state keeps no release for these
        for r in running:
            if r.job.id in victims:
                continue
            end = self.now if r.preempting else r.expected_end()
            out.append(Release(math.inf if end is None else end, r.job.id, releases_of(r.placement, self.fi)))
        if self.releasing:
            out.append(Release(self.now, "", tuple(sorted(self.releasing.items()))))
        return out
