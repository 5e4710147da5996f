"""Preemption and reclaim: which running jobs to checkpoint so that a pending job fits.

Rules (the issue's, enforced here and checked by property tests):
- within a queue, only by strictly higher priority (a tie never preempts);
- across queues, only to reclaim guarantee: the preemptor stays within its guarantee, and victims
  come from sibling subtrees that are borrowing (over their own guarantee) at the moment each one
  is picked;
- under LAS, a job with much less attained service may preempt one with much more;
- never a victim: non-preemptible jobs, jobs younger than `min_runtime_seconds`, jobs already
  preempting, a job already preempted once by this preemptor, or the job that preempted it (no
  ping-pong), a job that spent its preemption budget (preempted `preemption_budget` times within
  `preemption_budget_seconds`: no loops);
- victims minimise lost work (GPU-seconds since their last checkpoint), then their number;
- never preempt unless the preemptor provably fits once the victims are gone: the placement is
  simulated on the index (Statement, rolled back) and the quota re-checked.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from corral.core.decisions import Reason, ReasonCode
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
from corral.core.ordering import tree_for
from corral.core.placement import find_placement
from corral.core.quota import QueueTree, QueueUsage, quota_check, within_guarantee

_SINGLETON_TRIES = 32


@dataclass(frozen=True, slots=True)
class PreemptionPlan:
    """Victims (sorted by id), where the preemptor will run once they are gone, and why."""

    victims: tuple[RunningJob, ...]
    placement: Placement
    reason: Reason

    @property
    def victim_ids(self) -> tuple[str, ...]:
        return tuple(v.job.id for v in self.victims)


def victim_cost_key(r: RunningJob, now: float) -> tuple[float, int, int, str]:
    """Cheapest victims first: least work lost, then lowest priority, then most GPUs freed."""
    return (r.lost_work(now), r.job.priority, -r.placement.gpu_count, r.job.id)


def budget_spent(preempted_at: Sequence[float], now: float, config: SchedulerConfig) -> bool:
    """Whether a job preempted at `preempted_at` has no preemption left in the budget's window."""
    budget = config.preemption_budget
    if budget <= 0 or len(preempted_at) < budget:
        return False
    window = config.preemption_budget_seconds
    return sum(1 for t in preempted_at if now - t < window) >= budget


def statically_eligible(r: RunningJob, now: float, config: SchedulerConfig) -> bool:
    """Whether a running job may ever be a victim this cycle, whoever the preemptor."""
    return (not r.preempting and r.job.preemptible and now - r.start_time >= r.job.min_runtime_seconds
            and not budget_spent(r.preempted_at, now, config))


def _lca_children(tree: QueueTree, a: str, b: str) -> tuple[str, str]:
    """The two children of the lowest common ancestor of queues a and b, on a's and b's side."""
    pa = tree.path(a)[::-1]
    pb = tree.path(b)[::-1]
    n = 0
    while n < len(pa) and n < len(pb) and pa[n] == pb[n]:
        n += 1
    return pa[min(n, len(pa) - 1)], pb[min(n, len(pb) - 1)]


def _kind(
    snapshot: Snapshot,
    config: SchedulerConfig,
    tree: QueueTree,
    usage: QueueUsage,
    pending: PendingJob,
    r: RunningJob,
    cache: _ReclaimCache | None = None,
) -> ReasonCode | None:
    job = pending.job
    now = snapshot.now
    if not statically_eligible(r, now, config):
        return None
    if job.id in r.preempted_by or r.job.id in pending.preempted_by or r.job.id == job.id:
        return None
    if config.preemption and r.job.queue == job.queue and r.job.priority < job.priority:
        return ReasonCode.PREEMPTED_FOR_PRIORITY
    if config.preemption and config.order is OrderPolicy.LAS:
        theirs, mine = r.attained(now), pending.attained_gpu_seconds
        if theirs >= config.las_preemption_ratio * mine and theirs - mine >= config.las_min_gap_gpu_seconds:
            return ReasonCode.PREEMPTED_FOR_LAS
    if config.reclaim and config.quotas and r.job.queue != job.queue and tree.known(job.queue):
        sides = _lca_children(tree, job.queue, r.job.queue) if cache is None else cache.sides(r.job.queue)
        mine_side, their_side = sides
        if mine_side == their_side:
            return None  # one queue is the other's ancestor: not a reclaim between siblings
        entitled = (
            within_guarantee(tree, usage, job.queue, job.total_gpus, upto=mine_side)
            if cache is None
            else cache.entitled(mine_side)
        )
        if not entitled:
            return None
        if usage.active.get(their_side, 0) > tree.guarantee.get(their_side, 0):
            return ReasonCode.RECLAIMED_FOR_GUARANTEE
    return None


class _ReclaimCache:
    """Per-plan answers that do not change while victims are picked: which sibling subtrees a
    victim's queue and the preemptor's meet at, and whether the preemptor is entitled there
    (victims only leave other subtrees, so the preemptor's own usage is fixed)."""

    def __init__(self, tree: QueueTree, usage: QueueUsage, job: Job):
        self.tree, self.usage, self.job = tree, usage, job
        self._sides: dict[str, tuple[str, str]] = {}
        self._entitled: dict[str, bool] = {}

    def sides(self, queue: str) -> tuple[str, str]:
        s = self._sides.get(queue)
        if s is None:
            s = self._sides[queue] = _lca_children(self.tree, self.job.queue, queue)
        return s

    def forget_entitlement(self) -> None:
        self._entitled.clear()

    def entitled(self, mine_side: str) -> bool:
        e = self._entitled.get(mine_side)
        if e is None:
            e = self._entitled[mine_side] = within_guarantee(
                self.tree, self.usage, self.job.queue, self.job.total_gpus, upto=mine_side
            )
        return e


def _masks(fi: FreeGpus, r: RunningJob) -> tuple[tuple[int, int], ...]:
    return fi.masks_of(r.placement)


def _release(stmt: Statement, fi: FreeGpus, masks: Iterable[tuple[int, int]]) -> None:
    for i, m in masks:
        give = m & ~fi.free[i] & fi.all_masks[i]
        if give:
            stmt.give(i, give)


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
) -> PreemptionPlan | Reason | None:
    """The cheapest victim set among `candidates` after which the job fits, or a Reason, or None
    when no running job is an eligible victim at all. `free` is left exactly as it was.

    Search: victims sorted by lost work; the shortest prefix that fits is found by galloping then
    bisection on one journal (releases are undone with Statement.rollback_to), then victims that
    are not needed are pruned and a single cheaper victim is preferred when one suffices.
    `presorted=True` promises `candidates` are already in `victim_cost_key` order.
    `check_quota=False` skips the quota re-check when the job already passes quota without victims
    (removing victims never makes quota worse).
    """
    now = snapshot.now
    ordered = [r for r in candidates if r.job.id not in taken]
    if not presorted:
        ordered.sort(key=lambda r: victim_cost_key(r, now))
    seq = _VictimSequence(snapshot, config, tree, usage, pending, ordered)
    if not seq.extend(1):
        return None
    base = Statement(free)
    try:
        # GPUs already being released by earlier preemptions count as free for this plan
        for i, m in (releasing or {}).items():
            give = m & ~free.free[i] & free.all_masks[i]
            if give:
                base.give(i, give)
        return _search(snapshot, pending, config, free, tree, usage, seq, check_quota)
    finally:
        base.rollback()


class _VictimSequence:
    """Eligible victims in cost order, built lazily: most plans need only the first few, and
    eligibility of a reclaim victim depends on the ones before it (its queue must still borrow)."""

    def __init__(
        self,
        snapshot: Snapshot,
        config: SchedulerConfig,
        tree: QueueTree,
        usage: QueueUsage,
        pending: PendingJob,
        ordered: list[RunningJob],
    ):
        self.args = (snapshot, config, tree)
        self.work = usage.copy()
        self.pending = pending
        self.ordered = ordered
        self.pos = 0
        self.items: list[RunningJob] = []
        self.kinds: dict[str, ReasonCode] = {}
        self.gpus = 0
        self.cache = _ReclaimCache(tree, self.work, pending.job)

    def extend(self, k: int) -> bool:
        """Grow to at least k victims; False when fewer exist."""
        snapshot, config, tree = self.args
        while len(self.items) < k and self.pos < len(self.ordered):
            r = self.ordered[self.pos]
            self.pos += 1
            kind = _kind(snapshot, config, tree, self.work, self.pending, r, self.cache)
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


def _search(
    snapshot: Snapshot,
    pending: PendingJob,
    config: SchedulerConfig,
    fi: FreeGpus,
    tree: QueueTree,
    usage: QueueUsage,
    seq: _VictimSequence,
    check_quota: bool,
) -> PreemptionPlan | Reason:
    job = pending.job
    now = snapshot.now
    need = job.total_gpus
    mask_cache: dict[str, tuple[tuple[int, int], ...]] = {}

    def masks(r: RunningJob) -> tuple[tuple[int, int], ...]:
        m = mask_cache.get(r.job.id)
        if m is None:
            m = mask_cache[r.job.id] = _masks(fi, r)
        return m

    def quota_ok(victims: Sequence[RunningJob]) -> bool:
        if not check_quota:
            return True
        after = usage.copy()
        for v in victims:
            after.add(v.job.queue, -v.placement.gpu_count, active=not v.preempting)
        return quota_check(snapshot, job, after, tree=tree, quotas=config.quotas) is None

    def place_now() -> Placement | None:
        found = find_placement(fi.cluster, fi, job)
        return found if isinstance(found, Placement) else None

    def fits(victims: Sequence[RunningJob]) -> Placement | None:
        if fi.total_free + sum(v.placement.gpu_count for v in victims) < need or not quota_ok(victims):
            return None
        stmt = Statement(fi)
        try:
            for v in victims:
                _release(stmt, fi, masks(v))
            return place_now()
        finally:
            stmt.rollback()

    def no_fit() -> Reason:
        seq.extend(len(seq.ordered))
        return Reason(
            ReasonCode.GANG_DOES_NOT_FIT,
            f"needs {job.shape}; even preempting all {len(seq.items)} eligible jobs "
            f"({seq.gpus} GPUs) would not make it fit",
            (("needs_gpus", need), ("eligible_victims", len(seq.items)), ("freeable_gpus", seq.gpus)),
        )

    # galloping over prefixes of the cost order on one journal, then bisection
    stmt = Statement(fi)
    marks: list[int] = []
    released = 0

    def to_prefix(k: int) -> None:
        nonlocal released
        if k < released:
            stmt.rollback_to(marks[k])
            del marks[k:]
            released = k
        while released < k:
            marks.append(stmt.mark())
            _release(stmt, fi, masks(seq.items[released]))
            released += 1

    def prefix_fits(k: int) -> bool:
        to_prefix(k)
        return quota_ok(seq.items[:k]) and place_now() is not None

    try:
        k = 0
        have = fi.total_free
        while have < need:
            if not seq.extend(k + 1):
                return no_fit()
            have += seq.items[k].placement.gpu_count
            k += 1
        lo, step = k - 1, 1  # prefixes of length <= lo are known not to fit
        hi = -1
        while True:
            if prefix_fits(k):
                hi = k
                break
            lo = k
            seq.extend(k + step)
            if k >= len(seq.items):
                break
            k = min(len(seq.items), k + step)
            step *= 2
        if hi < 0:
            return no_fit()
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if prefix_fits(mid):
                hi = mid
            else:
                lo = mid
    finally:
        stmt.rollback()
    if hi == 0:
        return Reason(
            ReasonCode.GANG_DOES_NOT_FIT,
            f"needs {job.shape}; it fits without preemption, on GPUs held for another job",
            (("needs_gpus", need), ("eligible_victims", 0)),
        )
    chosen = seq.items[:hi]
    # prune: drop the most expensive victims that are not needed
    if len(chosen) <= 64:
        for v in sorted(chosen, key=lambda r: (-r.lost_work(now), r.job.id)):
            if len(chosen) > 1:
                trial = [c for c in chosen if c is not v]
                if fits(trial) is not None:
                    chosen = trial

    def cost(vs: Sequence[RunningJob]) -> tuple[float, int]:
        return (sum(v.lost_work(now) for v in vs), len(vs))

    best = cost(chosen)
    seq.extend(_SINGLETON_TRIES)
    for r in seq.items[:_SINGLETON_TRIES]:
        if cost([r]) >= best:
            break
        if fits([r]) is not None:
            chosen = [r]
            break
    placement = fits(chosen)
    assert placement is not None
    kinds = {seq.kinds[v.job.id] for v in chosen}
    return PreemptionPlan(
        tuple(sorted(chosen, key=lambda r: r.job.id)),
        placement,
        _reason(job_kinds=kinds, victims=chosen, now=now),
    )


def _reason(job_kinds: set[ReasonCode], victims: Sequence[RunningJob], now: float) -> Reason:
    lost = sum(v.lost_work(now) for v in victims)
    gpus = sum(v.placement.gpu_count for v in victims)
    ids = ", ".join(sorted(v.job.id for v in victims))
    if ReasonCode.RECLAIMED_FOR_GUARANTEE in job_kinds:
        code = ReasonCode.RECLAIMED_FOR_GUARANTEE
        why = "reclaiming guaranteed GPUs from borrowing queues"
    elif ReasonCode.PREEMPTED_FOR_LAS in job_kinds:
        code = ReasonCode.PREEMPTED_FOR_LAS
        why = "victims attained far more service"
    else:
        code = ReasonCode.PREEMPTED_FOR_PRIORITY
        why = f"victims have lower priority (max {max(v.job.priority for v in victims)})"
    return Reason(
        code,
        f"preempting {len(victims)} job(s) ({ids}) holding {gpus} GPUs, {why}; "
        f"{lost:.0f} GPU-seconds since their last checkpoint are lost",
        (("victims", len(victims)), ("freed_gpus", gpus), ("lost_gpu_seconds", lost)),
    )


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
