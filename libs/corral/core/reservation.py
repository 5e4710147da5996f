"""Quota reservation: which waiting jobs get their queue's quota this round (the quota service).

Quota is reserved job by job in fair-share order (`order_pending`), each checked against the queue
tree (`quota_check`) with the usage of everything running or already reserved. A reservation lets
placement start the job as soon as it fits.

Why: quota, placement and preemption are separate services deciding on the same state, so quota
asks what preemption would do next. Otherwise a gang of a borrowing queue is reserved while the
lending queue's guaranteed job waits for GPUs, placement backfills it (the guaranteed job's EASY
reservation expects to start only when running jobs end), and the next preemption round reclaims
it for that job at once (a freshly started gang has no work to lose: the cheapest victim), round
after round.

The rule (Kueue's, for `reclaimWithinCohort` and priority preemption: a workload that would be
preempted by the next scheduling step is not admitted; the preemptor's capacity is kept for it):
a job is reserved only if the preemption decision on the state this round creates does not take
it back. Jobs that no waiting job could ever preempt (within their guarantees at every level, or
not preemptible, or nothing of higher priority waits in their queue) are reserved on the quota
check alone, as before, so a big guaranteed gang still reaches placement and its reservation.
For the others ("exposed": see `Exposure`) the round is played out with the core's own
decisions, the same ones the services take (`corral.core.steps`):
1. placement: `placement_step` over every job holding quota, this round's included;
2. preemption: `preemption_step` on the state where those jobs run;
a job reserved this round that (2) picks as a victim is not reserved, nor is one exposed already
at its turn in the order (it borrows, or a job of higher priority waits in its queue) that (1)
cannot start now and (2) does not make a preemptor: holding quota, it would start later, on
whatever GPUs come free first, and be reclaimed then. A job within its guarantees at its turn is
reserved even when it cannot start yet, as before. Not reserving a job changes the round, so
it is played again until no job reserved in it is a victim (each pass drops at least one job),
and a job not reserved counts for nothing: the jobs its quota blocked at their turn are checked
again without it (otherwise, found by the simulator's services pipeline under LAS, a held-back
8-GPU job kept the 1-GPU job that would preempt it out of its queue's quota, and nothing was
reserved, round after round). A reservation held from an earlier round is played out the same
way when it is exposed now (a job that may reclaim it arrived since): if placement would start
it and preemption take it back at once, it is given back (`Revoke`) instead of wasting the
victim's checkpoint grace (found by the simulator's services pipeline too). On a cluster where
nothing runs and no job holds quota, a round that would reserve no one reserves the first job
the play-out refused that placement starts (`_start_one`): an empty cluster never idles with work.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from corral.core.backlog import Backlog, Order
from corral.core.decisions import Pending, Place, Reason, ReasonCode
from corral.core.exposure import Exposure, Growing
from corral.core.flat_pass import FlatOrder, FlatPass, applies
from corral.core.model import Job, PendingJob, Placement, SchedulerConfig, Snapshot
from corral.core.quota import QueueTree, QueueUsage
from corral.core.quota_checks import Checks as _Checks
from corral.core.running_parts import RunningParts
from corral.core.steps import Step, StepMemos, step_config


@dataclass(frozen=True, slots=True)
class Reserve:
    """Reserve `gpus` of the job's queue for it; `borrowed` of them are above the queue's own
    guarantee (what a reclaim may take back)."""

    job_id: str
    gpus: int
    borrowed: int


def placement_config(config: SchedulerConfig) -> SchedulerConfig:
    """What the placement step decides with (`corral.core.steps.step_config`)."""
    return step_config(Step.PLACEMENT, config)


@dataclass(frozen=True, slots=True)
class Revoke:
    """Give back the quota a waiting job holds: placement would start it now and preemption
    take it back at once (`reason` names the job it would be taken back for)."""

    job_id: str
    reason: Reason


def reserve_quota(
    snapshot: Snapshot,
    config: SchedulerConfig = SchedulerConfig(),
    *,
    reserved: Collection[str] = frozenset(),
    held: Iterable[tuple[str, int]] = (),
    memos: StepMemos | None = None,
    explain: bool = True,
    backlog: Backlog | None = None,
) -> list[Reserve | Pending | Revoke]:
    """One decision per pending job not in `reserved`, in fair-share order: Reserve, or Pending
    with the reason; then a Revoke for each job of `reserved` that would be started and taken
    back at once. `snapshot.pending` holds every job waiting for GPUs; `reserved` names those
    among them that already hold quota (they count as used and are not decided again unless
    exposed); `held` is (queue, GPUs) still reserved by jobs neither running nor pending (not
    given back yet). `config` is the preemption service's: the one whose decisions must not
    undo these. A round in which every waiting job holds quota decides nothing (the quota service
    skips it: with a backlog that all holds quota, each round would replay placement for nothing).
    `memos`: the caller's, for the steps the round is played out with (a fresh one if None);
    `explain=False`: the same decisions, the play-out's refusals of jobs not holding quota without
    their reasons (nor placement's), each quota refusal with its reason at the job's turn, listed
    queue by queue where the order changes no decision (`flat_pass`);
    `backlog`: the caller's kept copy of `Backlog.of(snapshot, reserved)` (derived if None)."""
    backlog = backlog if backlog is not None else Backlog.of(snapshot, reserved)
    out, tail, revokes = _decide(snapshot, config, backlog, held, memos, explain)
    if tail is not None:
        out.extend(_refusals(tail.order.after(tail.start, snapshot.pending), tail.refused, tail.check))
    return [*out, *revokes]


@dataclass(frozen=True, slots=True)
class QuotaRound:
    """`reserve_quota`'s decisions with the refusals of the backlog it did not walk kept per class:
    `decisions` names some jobs; every other waiting job not in `reserved` waits for its class's
    reason, `rest[(queue, GPUs, user if by_user else None)]` (`reason_of`).

    Why: behind a full cohort the order is walked a few dozen jobs deep and the thousands after
    them are refused for one reason per (queue, GPUs); a decision object per waiting job, and a
    look at each by the quota service, made most of a round's cost (Kueue's shape)."""

    decisions: list[Reserve | Pending | Revoke]
    rest: dict[tuple[str, int, str | None], Reason]
    by_user: bool

    def reason_of(self, job: Job) -> Reason:
        return self.rest[(job.queue, job.total_gpus, job.user if self.by_user else None)]


def quota_round(
    snapshot: Snapshot,
    config: SchedulerConfig = SchedulerConfig(),
    *,
    reserved: Collection[str] = frozenset(),
    held: Iterable[tuple[str, int]] = (),
    memos: StepMemos | None = None,
    backlog: Backlog | None = None,
) -> QuotaRound:
    """`reserve_quota`, its refusals of the jobs it did not walk kept per class (`QuotaRound`).
    `backlog`: the caller's kept copy of `Backlog.of(snapshot, reserved)` (derived if None)."""
    backlog = backlog if backlog is not None else Backlog.of(snapshot, reserved)
    out, tail, revokes = _decide(snapshot, config, backlog, held, memos)
    if tail is None:
        return QuotaRound([*out, *revokes], {}, False)
    named = {d.job_id for d in out}
    jobs = tail.order.jobs
    out.extend(Pending(i, why) for i, why in tail.refused.items() if i in jobs and i not in named)
    rest: dict[tuple[str, int, str | None], Reason] = {}
    for key, n in tail.left.count.items():
        why = tail.check(tail.order.samples[key]) if n > 0 else None
        if why is not None:  # always, for a class with jobs left (`_Left.hopeless`)
            rest[key] = why
    return QuotaRound([*out, *revokes], rest, tail.order.by_user)


@dataclass(frozen=True, slots=True)
class _Tail:
    """The jobs after the first `start` of the order, refused without walking them (`_quota_pass`)."""

    order: Order
    start: int
    refused: Mapping[str, Reason]
    check: _Checks
    left: _Left


def _decide(
    snapshot: Snapshot, config: SchedulerConfig, backlog: Backlog, held: Iterable[tuple[str, int]],
    memos: StepMemos | None, explain: bool = True,
) -> tuple[list[Reserve | Pending], _Tail | None, list[Revoke]]:
    """`reserve_quota`'s decisions of the jobs walked, the tail not walked, and the Revokes."""
    if not backlog.waiting:
        return [], None, []
    memos = memos if memos is not None else StepMemos()
    parts = RunningParts.of(snapshot, memos.preemption)  # the preemption step's config is `config`
    tree = parts.tree(snapshot, config)
    base = parts.usage(tree)
    for queue, gpus in held:
        if tree.known(queue):
            base.add(queue, gpus)
    holders = backlog.holders
    order = Order(snapshot, config, tree, backlog)
    exposure = Exposure(config, tree, backlog.at, backlog.top)
    # decisions in an order of their own
    flat = FlatOrder(order, exposure, _Checks(snapshot, config, tree, base)) if not explain and applies(
        order, tree) else None
    refused: dict[str, Reason] = {}
    while True:
        usage = _usage(base, holders, refused)
        if flat is not None:
            taken = flat.take(usage, refused)
            admitted, borrowing, exposed = [j.id for j in taken.admitted], taken.borrowing, taken.exposed
        else:
            out, admitted, exposed, borrowing, tail = _quota_pass(snapshot, config, order, usage, exposure, refused,
                                                                  explain)
        # a reservation held from earlier rounds may be exposed now (a job that may reclaim it
        # arrived since): it is played out too, and given back if it would be taken back at once
        risky = exposure.among(holders, refused, usage)
        keep = set(holders) - set(risky) - set(refused)
        more = _played_out(snapshot, config, backlog, keep, admitted + risky, exposed | set(risky), borrowing,
                           memos, explain) if exposed or risky else {}
        refused.update(more)
        # A job not reserved after all (or whose reservation is revoked) counts for nothing: the
        # round is decided again without it (otherwise a refused job held its queue's quota against
        # the jobs it blocked, and the next round refused it again: nothing started, ever). Each
        # pass refuses at least one more job, so this ends.
        if not more:
            idle = not snapshot.running and set(holders) <= set(refused)
            if flat is not None and idle:  # `_start_one` reads the order: the same pass, walked
                out, _, _, _, tail = _quota_pass(snapshot, config, order, _usage(base, holders, refused), exposure,
                                                 refused, explain)
            elif flat is not None:
                out, tail = _flat_decisions(flat, taken, order, refused), None
            if idle:
                _start_one(snapshot, config, order.jobs, out, refused, tree, base, memos)
            return out, tail, [Revoke(i, refused[i]) for i in holders if i in refused]


def _usage(base: QueueUsage, holders: Mapping[str, Job], refused: Mapping[str, Reason]) -> QueueUsage:
    """A pass's usage at its start: the running jobs' and those still held, and every job holding
    quota but those refused (reserved but not yet placed counts too, unless revoked)."""
    usage = base.copy()
    tree = usage.tree
    for job in holders.values():
        if job.id not in refused and tree.known(job.queue):
            usage.add(job.queue, job.total_gpus, user=job.user)
    return usage


def _flat_decisions(flat: FlatOrder, taken: FlatPass, order: Order,
                    refused: Mapping[str, Reason]) -> list[Reserve | Pending]:
    """A pass taken queue by queue (`flat_pass`), as `_quota_pass` decides it: a Pending for each
    waiting job refused (by the play-out or the quota check), a Reserve for each admitted."""
    jobs = order.jobs
    out: list[Reserve | Pending] = [Pending(i, why) for i, why in refused.items() if i in jobs]
    out.extend(Pending(i, why) for i, why in flat.refusals)
    out.extend(Reserve(j.id, j.total_gpus, b) for j, b in taken.reserves())
    return out


def _quota_pass(
    snapshot: Snapshot,
    config: SchedulerConfig,
    order: Order,
    usage: QueueUsage,
    exposure: Exposure,
    refused: Mapping[str, Reason],
    explain: bool = True,
) -> tuple[list[Reserve | Pending], list[str], set[str], set[str], _Tail | None]:
    """Quota for each job in `order` but the `refused` ones (Pending with their reason, counting
    nothing): the decisions, the jobs reserved, those exposed to preemption, those exposed
    already at their turn (`borrowing`: they wait without quota unless they start now), and the
    tail of the order refused without being walked (None: all of it was walked).

    Once no job left in the order can get quota on the usage as it stands (asked per (queue,
    GPUs) after a run of refusals), none will (only a reservation changes the usage): the rest
    are refused without walking the order further (`_Tail`: listed, by `reserve_quota`, in the
    order's place where it was walked and in the snapshot's after that, `_Order.after`; nothing
    reads the order of refusals), each for its class's reason on the round's final usage (with
    `explain=False`, the reason at its turn: the same decisions, reworded for no one)."""
    tree = exposure.tree
    out: list[Reserve | Pending] = []
    admitted: list[Job] = []
    borrowing: set[str] = set()
    check = _Checks(snapshot, config, tree, usage)
    exposed_now = Growing(exposure, usage)
    left = _Left(order, refused)
    tail: _Tail | None = None
    for at, p in enumerate(order):
        job = p.job
        if job.id in refused:
            out.append(Pending(job.id, refused[job.id]))
            continue
        left.reached(job)
        blocked = check(job)
        if blocked is not None:
            out.append(Pending(job.id, blocked))
            if left.hopeless(check):
                tail = _Tail(order, at + 1, refused, check, left)
                break
            continue
        out.append(Reserve(job.id, job.total_gpus, _borrowed(tree, usage, job)))
        usage.add(job.queue, job.total_gpus, user=job.user)
        check.usage_changed()
        left.usage_changed()
        admitted.append(job)
        if exposed_now(job):
            borrowing.add(job.id)
    if admitted and explain:  # a refusal states the usage after the whole round (later jobs took quota after its turn)
        jobs = order.jobs  # not the order itself: that would walk all of it
        out = [Pending(d.job_id, check(jobs[d.job_id].job) or d.reason)
               if isinstance(d, Pending) and d.job_id not in refused else d for d in out]
    # with every reservation of the round counted, more may be exposed (a later one pushed their
    # queue over its guarantee): those are checked against preemption too, but may wait with quota
    exposed = borrowing.union(exposure.among({j.id: j for j in admitted}, borrowing, usage))
    return out, [j.id for j in admitted], exposed, borrowing, tail


#: Refusals in a row after which a pass asks whether any job left could still get quota. The
#: question costs a cached check per (queue, GPUs) left, a walked job its fair-share step and
#: check: behind full cohorts a pass reserves a few jobs and then walks only this many.
_LOOK_AFTER = 8


class _Left:
    """The (queue, GPUs) of the jobs a pass has not reached yet, to ask whether any of them could
    still get quota on the usage as it stands (asked once after `_LOOK_AFTER` refusals in a row,
    then not again until the usage changes: the answers would be the same)."""

    def __init__(self, order: Order, refused: Mapping[str, Reason]) -> None:
        self.count = dict(order.classes)
        self.sample = order.samples
        self.by_user = order.by_user
        for job_id in refused:
            p = order.jobs.get(job_id)  # a revoked holder is not in the order
            if p is not None:
                self.count[self._key(p.job)] -= 1
        self.refusals, self.looked = 0, False

    def _key(self, job: Job) -> tuple[str, int, str | None]:
        return (job.queue, job.total_gpus, job.user if self.by_user else None)

    def reached(self, job: Job) -> None:
        self.count[self._key(job)] -= 1

    def usage_changed(self) -> None:
        self.refusals, self.looked = 0, False

    def hopeless(self, check: _Checks) -> bool:
        """After a refusal: whether every job not reached yet would be refused too."""
        self.refusals += 1
        if self.refusals < _LOOK_AFTER or self.looked:
            return False
        self.looked = True
        return all(check(self.sample[key]) is not None for key, n in self.count.items() if n > 0)


def _refusals(jobs: Iterable[PendingJob], refused: Mapping[str, Reason], check: _Checks) -> Iterator[Pending]:
    for p in jobs:
        why = refused.get(p.job.id) or check(p.job)
        assert why is not None  # `_Left.hopeless`: every (queue, GPUs) left is refused
        yield Pending(p.job.id, why)


def _played_out(
    snapshot: Snapshot, config: SchedulerConfig, backlog: Backlog, reserved: Collection[str],
    admitted: Sequence[str], exposed: set[str], borrowing: set[str], memos: StepMemos, explain: bool = True,
) -> dict[str, Reason]:
    """Play the round (placement, then preemption) and return the jobs of `admitted` not to
    reserve after all, with why; see the module docstring. Only `exposed` jobs can be victims
    (`Exposure` is a superset of what preemption accepts): when none of them starts and no
    `borrowing` job waits, the preemption step (a whole cycle over the backlog) is skipped.
    `reserved` (of `backlog.holders`) and `admitted` are pending jobs: no pass over the snapshot's."""

    def job(i: str) -> Job:
        return held if (held := backlog.holders.get(i)) is not None else backlog.waiting[i].job

    def said(i: str) -> bool:  # a revoked reservation states its reason (`Revoke`) even unexplained
        return explain or i in backlog.holders

    keep = set(admitted)
    refused: dict[str, Reason] = {}
    while True:
        holders = keep.union(reserved)
        placed: dict[str, Placement] = {}
        waits: dict[str, Reason] = {}
        for d in memos.place(snapshot, config, holders, explain=explain):
            if isinstance(d, Place):
                placed[d.job_id] = d.placement
            elif isinstance(d, Pending):
                waits[d.job_id] = d.reason
        waiting = sorted(i for i in borrowing & keep if i not in placed)
        if not waiting and not any(i in exposed for i in placed):
            return refused
        preempts = memos.preempt(snapshot, config, placed)
        drop: dict[str, Reason] = {}
        for d in preempts:
            for v in d.victims:
                if v in keep and v not in drop:
                    drop[v] = _taken_back(job(v), job(d.job_id), d.reason) if said(v) else _UNSAID
        preemptors = {d.job_id for d in preempts}
        for i in waiting:
            if i not in preemptors and i not in drop:
                drop[i] = _cannot_start(job(i), waits.get(i)) if said(i) else _UNSAID
        if not drop:
            return refused
        refused.update(drop)
        keep.difference_update(drop)


def _start_one(
    snapshot: Snapshot, config: SchedulerConfig, jobs: Mapping[str, PendingJob], out: list[Reserve | Pending],
    refused: dict[str, Reason], tree: QueueTree, usage: QueueUsage, memos: StepMemos,
) -> None:
    """On a cluster where nothing runs and no waiting job holds quota, a round the play-out left
    with no reservation reserves the first job of the order that it refused and that placement
    starts on its own. There the refusals rest on one another (under LAS a fresh job would preempt
    one with attained service and a job of higher priority in its queue would preempt the fresh
    one: each is refused for the other, and the jobs they crowded out of the play-out with them):
    no job that runs or will run stands behind them, and the GPUs would stay idle with work waiting,
    round after round. The job started may be preempted at once; the preemption is remembered
    (`PendingJob.preempted_by`), so the same ring does not turn again."""
    if any(isinstance(d, Reserve) for d in out):
        return
    for at, d in enumerate(out):
        if d.job_id in refused and any(isinstance(p, Place) for p in memos.place(snapshot, config, {d.job_id},
                                                                                  explain=False)):
            job = jobs[d.job_id].job
            del refused[d.job_id]
            out[at] = Reserve(job.id, job.total_gpus, _borrowed(tree, usage, job))
            return


#: The reason of a play-out's refusal of a job not holding quota when the round explains nothing
#: (`explain=False`: read by no one).
_UNSAID = Reason(ReasonCode.GANG_DOES_NOT_FIT, "")


def _taken_back(job: Job, by: Job, why: Reason) -> Reason:
    how = "reclaim the GPUs its queue would borrow" if why.code is ReasonCode.RECLAIMED_FOR_GUARANTEE else "preempt it"
    return Reason(
        ReasonCode.RESERVED_FOR,
        f"not reserved: job {by.id} of queue {by.queue} waits and would {how} at once "
        f"({why.code}); queue {job.queue}'s quota is reserved for {job.id} once it would not",
        (("reserved_for", by.id), ("preempt_reason", str(why.code))),
    )


def _cannot_start(job: Job, why: Reason | None) -> Reason:
    """An exposed job that could not start now: it waits without quota, for placement's reason."""
    suffix = (
        "; a job a waiting job could preempt gets quota only when it can start at once "
        "(so it is not started later on GPUs that job is owed)"
    )
    if why is None:
        return Reason(
            ReasonCode.GANG_DOES_NOT_FIT,
            f"needs {job.shape}; it cannot start now" + suffix,
            (("needs_gpus", job.total_gpus),),
        )
    return Reason(why.code, why.message + suffix, why.details)


def _borrowed(tree: QueueTree, usage: QueueUsage, job: Job) -> int:
    """GPUs of this reservation above the queue's own guarantee (what a reclaim may take back)."""
    guarantee = tree.guarantee.get(job.queue, 0)
    used = usage.held.get(job.queue, 0)
    return max(0, min(job.total_gpus, used + job.total_gpus - guarantee))
