"""A preemption plan for one pending job: `plan_preemption` (the cycle's) and `select_victims`
(the preemption service's, on a snapshot).

Why: a plan must never preempt unless the preemptor provably fits once the victims are
gone, and must cost as little lost work as it can. So it lists the eligible victims in cost
order (`candidates`), searches the cheapest set after which the job fits (`search`: placement
simulated on the index, quota re-checked) and explains the choice (`PreemptionPlan.reason`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from corral.core import reasons
from corral.core.decisions import Reason, ReasonCode
from corral.core.gpuset import FreeGpus, Statement
from corral.core.ledger import give_back
from corral.core.model import PendingJob, Placement, RunningJob, SchedulerConfig, Snapshot
from corral.core.ordering import tree_for
from corral.core.placement import placement_or_none
from corral.core.preemption.candidates import VictimSequence, victim_cost_key
from corral.core.preemption.eligibility import defragmenting
from corral.core.preemption.search import VictimSearch
from corral.core.quota import QueueTree, QueueUsage


@dataclass(frozen=True, slots=True)
class PreemptionPlan:
    """Victims (sorted by id), where the preemptor will run once they are gone, and why."""

    victims: tuple[RunningJob, ...]
    placement: Placement
    reason: Reason

    @property
    def victim_ids(self) -> tuple[str, ...]:
        return tuple(v.job.id for v in self.victims)


def plan_preemption(
    snapshot: Snapshot,
    pending: PendingJob,
    config: SchedulerConfig,
    *,
    free: FreeGpus,
    tree: QueueTree,
    usage: QueueUsage,
    candidates: Sequence[RunningJob],
    taken: set[str] | frozenset[str] = frozenset(),
    check_quota: bool = True,
    releasing: dict[int, int] | None = None,
    presorted: bool = False,
    explain: bool = True,
    eligible: bool = False,
) -> PreemptionPlan | Reason | None:
    """The cheapest victim set among `candidates` after which the job fits, or a Reason, or None
    when no running job is an eligible victim at all. `free` is left exactly as it was.

    `presorted=True` promises `candidates` are already in `victim_cost_key` order.
    `check_quota=False` skips the quota re-check when the job already passes quota without victims
    (removing victims never makes quota worse). GPUs in `releasing` (being released by earlier
    preemptions) count as free for this plan. `explain=False`: a caller that drops the Reason when
    no victim set fits gets a short one, not worded from every eligible victim. `eligible=True`
    promises every candidate is `statically_eligible` at the snapshot's time (a cycle's `Candidates`).
    FAIR_LAS moves jobs (`eligibility.defragments`) only when the idle GPUs of `free` add up to the
    job and only its queue's jobs wait (`eligibility.defragmenting`), and only in a set whose moved
    jobs fit elsewhere (`moved_fit`).
    """
    now = snapshot.now
    ordered = [r for r in candidates if r.job.id not in taken]
    if not presorted:
        ordered.sort(key=lambda r: victim_cost_key(r, now))
    defragment = defragmenting(config, pending.job, free.total_free, snapshot.pending)
    seq = VictimSequence(now, config, tree, usage, pending, ordered, eligible, defragment)
    if not seq.extend(1):
        return None
    base = Statement(free)
    try:
        give_back(base, (releasing or {}).items())
        found = VictimSearch(snapshot, pending, config, free, tree, usage, seq, check_quota, explain).run()
    finally:
        base.rollback()
    if isinstance(found, Reason):
        return found
    chosen, placement = found
    if defragment and not moved_fit(free, chosen, placement, seq.kinds, releasing):
        return _UNMOVED
    kinds = {seq.kinds[v.job.id] for v in chosen}
    victims = tuple(sorted(chosen, key=lambda r: r.job.id))
    return PreemptionPlan(victims, placement, reasons.preempting(kinds, chosen, now))


_UNMOVED = Reason(ReasonCode.GANG_DOES_NOT_FIT, "the jobs it would move do not fit on the idle GPUs left", ())


def moved_fit(free: FreeGpus, chosen: Sequence[RunningJob], placement: Placement, kinds: dict[str, ReasonCode],
              releasing: dict[int, int] | None = None) -> bool:
    """Whether the victims moved to defragment (`eligibility.defragments`) all fit on the idle GPUs
    once every victim is gone and the preemptor placed (largest first): a move never leaves a job
    waiting. GPUs in `releasing` may hold the preemptor but not a moved job (earlier preemptors
    claimed them). `free` is left as it was."""
    moved = sorted((v for v in chosen if kinds[v.job.id] is ReasonCode.PREEMPTED_TO_DEFRAGMENT),
                   key=lambda v: (-v.placement.gpu_count, v.job.id))
    if not moved:
        return True
    stmt = Statement(free)
    try:
        give_back(stmt, (releasing or {}).items())
        for v in chosen:
            give_back(stmt, free.masks_of(v.placement))
        for i, m in free.masks_of(placement):
            stmt.take(i, m)
        for i, m in (releasing or {}).items():
            if m & free.free[i]:
                stmt.take(i, m & free.free[i])
        for v in moved:
            spot = placement_or_none(free, v.job)
            if spot is None:
                return False
            for i, m in free.masks_of(spot):
                stmt.take(i, m)
        return True
    finally:
        stmt.rollback()


def select_victims(
    snapshot: Snapshot,
    job: PendingJob,
    config: SchedulerConfig = SchedulerConfig(),
    *,
    free: FreeGpus | None = None,
) -> tuple[str, ...] | Reason:
    """Victim ids for `job` on this snapshot (sorted), or a Reason why preemption cannot help.

    `free` defaults to the GPUs left free by every running job in the snapshot.
    """
    tree = tree_for(snapshot, config)
    usage = QueueUsage.of(tree, snapshot.running)
    fi = free if free is not None else FreeGpus.from_running(snapshot.cluster, snapshot.running)
    plan = plan_preemption(
        snapshot,
        job,
        config,
        free=fi,
        tree=tree,
        usage=usage,
        candidates=sorted(snapshot.running, key=lambda r: r.job.id),
    )
    if plan is None:
        return Reason(
            ReasonCode.GANG_DOES_NOT_FIT,
            f"needs {job.job.shape}; no running job may be preempted for it",
            (("needs_gpus", job.job.total_gpus), ("eligible_victims", 0)),
        )
    return plan if isinstance(plan, Reason) else plan.victim_ids
