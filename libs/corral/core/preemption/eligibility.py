"""Who may be a victim of whom: the one home of the victim rule.

Why: the rule is read when the cycle lists possible victims and when a plan picks them; split
between the two it drifts. Here the whole rule lives in one place:
- `statically_eligible`: whoever the preemptor, never a victim: non-preemptible, younger than
  `min_runtime_seconds`, already preempting, or its preemption budget spent (no loops);
- `victim_kind`: for one preemptor, the reason a running job may be its victim (priority within
  a queue, LAS but never of a higher priority of the preemptor's queue, a higher service level
  within a queue under FAIR_LAS, reclaim of guarantee from a borrowing sibling subtree), or None;
- under FAIR_LAS a level victim is one checkpointed lately (`fresh`), and reclaim goes by whole
  jobs: a queue short of its guarantee reclaims a job that may take it past it (a gang of 8 for a
  queue owed 22.9 GPUs and holding 16), and only from a sibling that keeps its own guarantee after
  losing the victim (no reclaim back and forth);
- under FAIR_LAS, when the idle GPUs add up to a waiting gang but lie in fragments and only the
  gang's queue waits (`defragmenting`), a smaller job of another queue checkpointed lately may be
  moved (`defragments`): it restarts on idle GPUs elsewhere, which the plan checks
  (`plan.moved_fit`), so its queue keeps its share;
- `same_queue_outranks` and `las_threshold`: the parts of `victim_kind` the candidate listing
  filters by (a superset, so that `victim_kind` still decides);
- `spared`: the running jobs a waiting job may never preempt because of their history (no
  ping-pong, never twice by the same preemptor): all that its decision reads of who preempted whom.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from corral.core.decisions import ReasonCode
from corral.core.levels import running_level, waiting_level
from corral.core.model import Job, OrderPolicy, PendingJob, RunningJob, SchedulerConfig
from corral.core.protection import level_protected
from corral.core.quota import QueueTree, QueueUsage, below_guarantee, within_guarantee


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


NONE_SPARED: frozenset[str] = frozenset()


def spared(p: PendingJob, running: Collection[str], victims_of: Mapping[str, Collection[str]]) -> frozenset[str]:
    """The running jobs `p` may not preempt for their history with it: those that preempted it
    (in `p.preempted_by` and in `running`, the running job ids) and those it preempted that run
    again (`victims_of`: preemptor -> the running jobs whose `preempted_by` names it). `victim_kind`
    reads `p.preempted_by` and the running jobs' `preempted_by` only as this set, so two waiting
    jobs that differ in nothing else get equal answers (their preemptors may have ended)."""
    mine = [x for x in p.preempted_by if x in running] if p.preempted_by else []
    theirs = victims_of.get(p.job.id)
    if theirs:
        mine.extend(theirs)
    return frozenset(mine) if mine else NONE_SPARED


def same_queue_outranks(job: Job, victim: Job) -> bool:
    """Within a queue, only a strictly higher priority preempts (a tie never does); and LAS never
    preempts a job that outranks its preemptor so, which would preempt it back (no ping-pong)."""
    return victim.queue == job.queue and victim.priority < job.priority


def outserved(config: SchedulerConfig, pending: PendingJob, r: RunningJob, now: float) -> bool:
    """FAIR_LAS: `r`, of the waiting job's queue and no larger than it, has reached a strictly
    higher service level (the levels of `levels.waiting_level` and `levels.running_level`: a
    promoted job counts as level 0 both ways). No larger: a victim's GPUs the preemptor does not take are released to
    whoever comes next in the fair-share order, often another queue's job, so a larger victim
    would move GPUs from its queue to others (a swap inside a queue keeps the queues' shares).
    A job swapped out often is spared while its run is short (`protection.level_protected`)."""
    th = config.las_thresholds
    return (config.order is OrderPolicy.FAIR_LAS and r.job.queue == pending.job.queue
            and r.placement.gpu_count <= pending.job.total_gpus
            and running_level(r, th, now) > waiting_level(pending, config, now)
            and fresh(config, r, now) and not level_protected(r, now, config))


def fresh(config: SchedulerConfig, r: RunningJob, now: float) -> bool:
    """Whether `r` checkpointed (or started) within `level_victim_fresh_seconds` (0: any time):
    a level victim taken soon after its checkpoint loses little work, and a preemptor that finds
    none waits at most one checkpoint interval for one."""
    window = config.level_victim_fresh_seconds
    return window <= 0 or r.lost_work(now) <= window * r.job.total_gpus


def defragments(config: SchedulerConfig, pending: PendingJob, r: RunningJob, now: float) -> bool:
    """FAIR_LAS: `r`, of another queue and on fewer GPUs than the waiting job, has checkpointed
    since it started and lately (`fresh`): moving it loses little work, and a job reserved in the
    round it starts is never moved."""
    return (config.order is OrderPolicy.FAIR_LAS and r.job.queue != pending.job.queue
            and r.placement.gpu_count < pending.job.total_gpus
            and r.last_checkpoint_time is not None and r.last_checkpoint_time > r.start_time
            and fresh(config, r, now))


def defragmenting(config: SchedulerConfig, job: Job, idle: int | None, waiting: Iterable[PendingJob] = ()) -> bool:
    """Whether a plan for `job` may move jobs for it: FAIR_LAS with preemption and
    `SchedulerConfig.defragment`, the idle GPUs add
    up to the job (`idle`; None: unknown, maybe) but lie in fragments, and no job of another queue
    is among the `waiting` ones (a moved job restarts at once, and nobody else waits for the GPUs)."""
    return (config.defragment and config.order is OrderPolicy.FAIR_LAS and config.preemption
            and (idle is None or idle >= job.total_gpus)
            and all(p.job.queue == job.queue for p in waiting))


def las_threshold(config: SchedulerConfig, mine: float) -> float:
    """Attained service a LAS victim needs at least (both the ratio and the gap must hold)."""
    return max(config.las_preemption_ratio * mine, mine + config.las_min_gap_gpu_seconds)


def lca_children(tree: QueueTree, a: str, b: str) -> tuple[str, str]:
    """The two children of the lowest common ancestor of queues a and b, on a's and b's side."""
    pa = tree.path(a)[::-1]
    pb = tree.path(b)[::-1]
    n = 0
    while n < len(pa) and n < len(pb) and pa[n] == pb[n]:
        n += 1
    return pa[min(n, len(pa) - 1)], pb[min(n, len(pb) - 1)]


class ReclaimCache:
    """Per-plan answers that do not change while victims are picked: which sibling subtrees a
    victim's queue and the preemptor's meet at, and whether the preemptor is entitled there
    (victims only leave other subtrees, so the preemptor's own usage is fixed)."""

    def __init__(self, tree: QueueTree, usage: QueueUsage, job: Job, by_whole_jobs: bool = False):
        self.tree, self.usage, self.job, self.by_whole_jobs = tree, usage, job, by_whole_jobs
        self._sides: dict[str, tuple[str, str]] = {}
        self._entitled: dict[str, bool] = {}

    def sides(self, queue: str) -> tuple[str, str]:
        s = self._sides.get(queue)
        if s is None:
            s = self._sides[queue] = lca_children(self.tree, self.job.queue, queue)
        return s

    def forget_entitlement(self) -> None:
        self._entitled.clear()

    def entitled(self, mine_side: str) -> bool:
        e = self._entitled.get(mine_side)
        if e is None:
            e = self._entitled[mine_side] = entitled(self.tree, self.usage, self.job, mine_side, self.by_whole_jobs)
        return e


def reclaims_by_whole_jobs(config: SchedulerConfig) -> bool:
    """FAIR_LAS reclaims by whole jobs (module docstring); the other policies by the guarantee's GPUs."""
    return config.order is OrderPolicy.FAIR_LAS


def entitled(tree: QueueTree, usage: QueueUsage, job: Job, upto: str | None, by_whole_jobs: bool) -> bool:
    """Whether `job` may reclaim: its queue short of its guarantee (`by_whole_jobs`), else still
    within it with the job's GPUs added."""
    if by_whole_jobs:
        return below_guarantee(tree, usage, job.queue, upto=upto)
    return within_guarantee(tree, usage, job.queue, job.total_gpus, upto=upto)


def victim_kind(
    now: float,
    config: SchedulerConfig,
    tree: QueueTree,
    usage: QueueUsage,
    pending: PendingJob,
    r: RunningJob,
    cache: ReclaimCache | None = None,
    eligible: bool = False,
    defragment: bool = False,
) -> ReasonCode | None:
    """Why `r` may be preempted for `pending` right now (`usage` as the plan has it so far), or
    None when it may not. `eligible`: `r` is known `statically_eligible` at `now` (a cycle's
    `Candidates` hold only such jobs), not checked again. `defragment`: the plan may move jobs for
    the waiting one (`defragmenting`), so `defragments` is a reason too."""
    job = pending.job
    if not eligible and not statically_eligible(r, now, config):
        return None
    if job.id in r.preempted_by or r.job.id in pending.preempted_by or r.job.id == job.id:
        return None  # no ping-pong, and never twice by the same preemptor
    if config.preemption and same_queue_outranks(job, r.job):
        return ReasonCode.PREEMPTED_FOR_PRIORITY
    if config.preemption and config.order is OrderPolicy.LAS and not same_queue_outranks(r.job, job):
        theirs, mine = r.attained(now), pending.attained_gpu_seconds
        if theirs >= config.las_preemption_ratio * mine and theirs - mine >= config.las_min_gap_gpu_seconds:
            return ReasonCode.PREEMPTED_FOR_LAS
    if config.preemption and outserved(config, pending, r, now):
        return ReasonCode.PREEMPTED_FOR_LAS
    if config.reclaim and config.quotas and r.job.queue != job.queue and tree.known(job.queue):
        kind = _reclaim_kind(tree, usage, job, r, cache, reclaims_by_whole_jobs(config))
        if kind is not None:
            return kind
    if defragment and config.preemption and defragments(config, pending, r, now):
        return ReasonCode.PREEMPTED_TO_DEFRAGMENT
    return None


def _reclaim_kind(
    tree: QueueTree, usage: QueueUsage, job: Job, r: RunningJob, cache: ReclaimCache | None, by_whole_jobs: bool
) -> ReasonCode | None:
    """Across queues, only to reclaim guarantee: the preemptor is entitled (`entitled`) and the
    victim's sibling subtree borrows (is over its own guarantee; by whole jobs: stays at or over
    it without the victim)."""
    mine_side, their_side = lca_children(tree, job.queue, r.job.queue) if cache is None else cache.sides(r.job.queue)
    if mine_side == their_side:
        return None  # one queue is the other's ancestor: not a reclaim between siblings
    allowed = entitled(tree, usage, job, mine_side, by_whole_jobs) if cache is None else cache.entitled(mine_side)
    if not allowed:
        return None
    theirs, owed = usage.active.get(their_side, 0), tree.guarantee.get(their_side, 0)
    if (theirs - r.placement.gpu_count >= owed) if by_whole_jobs else theirs > owed:
        return ReasonCode.RECLAIMED_FOR_GUARANTEE
    return None
