"""Exact unblock hints: the smallest set of events after which the core itself places a waiting job.

Why: a guess beside the core (running jobs released in order of expected end until the job alone
fits) is wrong in the ways a new user finds at once: it names a job of another queue whose GPU then
goes to the next job in fair-share order; it names one of two jobs that must end; it never says
that the job's queue is under its guarantee.

The hint is a search over what-if states (`whatif`), each decided by the cycle itself:
- the candidates are events: each running job ends (soonest expected end first, jobs without an
  estimate after them), each lost node comes back, the job's queue gets the quota it lacks;
- the shortest prefix of that order after which the rerun places the job (bisection; every prefix
  tried is rerun, so the answer holds even where more events do not always help), then pruned:
  an event is left out while the rest still places the job, until none can be;
- when that leaves more than one event, each single candidate (the first `SINGLES`) is tried too.

Minimal, as the docs define it (docs/architecture.md, "Exact unblock hints"): applying every event
of the hint and rerunning the cycle places the job; leaving out any one of them does not; and a
hint of several events means no single one of the first `SINGLES` candidates would do. The jobs
ahead of it that the same rerun starts on freed GPUs are named ("then job K, ahead of it in queue
A, takes ..."), and the fair-share standing of the queues involved is part of the answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from corral.core.decisions import Decision, Place, Preempt, ReasonCode
from corral.core.model import Job, NodeState, SchedulerConfig, Snapshot
from corral.core.ordering import tree_for
from corral.core.placement import static_feasibility
from corral.core.quota import QueueUsage, quota_check
from corral.core.whatif import (
    GpusBack,
    JobEnds,
    NodeBack,
    QuotaRaised,
    Rerun,
    WhatIf,
    apply_events,
    job_ends,
    placed,
)

#: single events tried one by one when the pruned set names several (those that could make room)
SINGLES = 48
#: reruns of the cycle one hint may take (the search stops early, still correct, when it runs out)
MAX_RERUNS = 250


class HintKind(StrEnum):
    FITS_NOW = "fits_now"  # the cycle places it as things are
    PREEMPTING = "preempting"  # the cycle makes it a preemptor: it starts once its victims are gone
    EVENTS = "events"  # the events named place it
    BEHIND = "behind"  # even with every event, the jobs ahead of it take the room first
    NEVER = "never"  # no event the search knows places it


@dataclass(frozen=True, slots=True)
class Taker:
    """A job ahead of the hinted one that the what-if rerun starts on the GPUs the events free."""

    job_id: str
    queue: str
    gpus: int


@dataclass(frozen=True, slots=True)
class Standing:
    """A queue's fair-share state: GPUs its subtree holds against its guarantee and ceiling."""

    queue: str
    used: int
    guaranteed: int
    max_gpus: int | None

    @property
    def borrowed(self) -> int:
        return max(0, self.used - self.guaranteed)

    def describe(self) -> str:
        where = ("under its guarantee" if self.used < self.guaranteed else
                 f"borrows {self.borrowed}" if self.borrowed else "at its guarantee")
        ceiling = "" if self.max_gpus is None else f", max {self.max_gpus}"
        return f"queue {self.queue} uses {self.used} of {self.guaranteed} guaranteed GPUs{ceiling} ({where})"


@dataclass(frozen=True, slots=True)
class Hint:
    """What would let `job_id` start. `events` (kind EVENTS) placed it in the rerun, where `takers`
    were started ahead of it and it used `uses` ((node, GPUs)); `standing`: its queue first, then
    the takers' and the borrowing queues'; `exhaustive`: every single event was tried too."""

    job_id: str
    kind: HintKind
    job: Job
    events: tuple[WhatIf, ...] = ()
    takers: tuple[Taker, ...] = ()
    uses: tuple[tuple[str, int], ...] = ()
    standing: tuple[Standing, ...] = ()
    victims: tuple[str, ...] = ()
    never: str = ""
    exhaustive: bool = True
    reruns: int = 0


def unblock(snapshot: Snapshot, job_id: str, config: SchedulerConfig = SchedulerConfig()) -> Hint:
    """The hint for pending job `job_id` of `snapshot` (pure; see the module docstring)."""
    job = next(p.job for p in snapshot.pending if p.job.id == job_id)
    run = Rerun(snapshot, config)
    base = run.actions()
    standing = _standing(snapshot, config, [job.queue])
    mine = next((d for d in base if d.job_id == job_id), None)
    if isinstance(mine, Place):
        return Hint(job_id, HintKind.FITS_NOW, job, uses=_uses(mine), standing=standing, reruns=run.count)
    if isinstance(mine, Preempt):
        return Hint(job_id, HintKind.PREEMPTING, job, victims=mine.victims, standing=standing, reruns=run.count)
    candidates = _candidates(snapshot, config, job)
    everything = run.actions(candidates)
    if placed(everything, job_id) is None:
        never = _never(snapshot, job)
        ahead = _takers(snapshot, base, everything, job_id) if not never else []
        kind = HintKind.BEHIND if ahead else HintKind.NEVER
        return Hint(job_id, kind, job, takers=tuple(ahead), standing=_standing(snapshot, config, [job.queue]),
                    never=never, reruns=run.count)
    chosen, exhaustive = _search(run, job, candidates)
    after = run.actions(chosen)
    takers = _takers(snapshot, base, after, job_id)
    mine_after = placed(after, job_id)
    assert mine_after is not None
    queues = [job.queue, *(t.queue for t in takers)]
    victims = mine_after.victims if isinstance(mine_after, Preempt) else ()
    uses = _uses(mine_after) if isinstance(mine_after, Place) else ()
    return Hint(job_id, HintKind.EVENTS, job, tuple(chosen), tuple(takers), uses,
                _standing(snapshot, config, queues), victims=victims, exhaustive=exhaustive, reruns=run.count)


def _takers(snapshot: Snapshot, base: Sequence[Decision], after: Sequence[Decision], job_id: str) -> list[Taker]:
    """Jobs the what-if rerun starts (or makes preemptors) before `job_id` that the cycle as things
    are does not: they take GPUs the events free."""
    before = {d.job_id for d in base if isinstance(d, Place | Preempt)}
    jobs = {p.job.id: p.job for p in snapshot.pending}
    out = []
    for d in after:
        if d.job_id == job_id:
            break
        if isinstance(d, Place | Preempt) and d.job_id not in before:
            j = jobs[d.job_id]
            out.append(Taker(j.id, j.queue, j.total_gpus))
    return out


def _search(run: Rerun, job: Job, candidates: Sequence[WhatIf]) -> tuple[list[WhatIf], bool]:
    """A shortest placing prefix, pruned to an irreducible set; then singles when it names several.
    Returns the events and whether the minimality checks all ran within the budget."""
    lo, hi = 0, len(candidates)  # the prefix of length hi places the job (checked by the caller)
    while hi - lo > 1 and run.count < MAX_RERUNS:
        mid = (lo + hi) // 2
        if run.places(job.id, candidates[:mid]):
            hi = mid
        else:
            lo = mid
    chosen, complete = _prune(run, job.id, list(candidates[:hi]))
    if len(chosen) <= 1:
        return chosen, complete
    # without preemption, a job needs that many GPUs free after the event: no rerun needed to know
    free = _free_gpus(run.snapshot) if not (run.config.preemption or run.config.reclaim) else job.total_gpus
    tried = 0
    for c in candidates:
        if free + _gpus_of(c) < job.total_gpus:
            continue
        if tried == SINGLES or run.count >= MAX_RERUNS:
            return chosen, False
        tried += 1
        if run.places(job.id, [c]):  # also one of `chosen`: fewer events may place it where more do not
            return [c], complete
    return chosen, complete


def _prune(run: Rerun, job_id: str, chosen: list[WhatIf]) -> tuple[list[WhatIf], bool]:
    """Leave out events while the rest still places the job: runs of them first (half, a quarter,
    ... of the set, latest first), then one at a time until a whole pass leaves none out."""
    size = max(1, len(chosen) // 2)
    while True:
        removed = False
        end = len(chosen)
        while end > 0:
            start = max(0, end - size)
            rest = chosen[:start] + chosen[end:]
            if rest and run.count >= MAX_RERUNS:
                return chosen, False
            if rest and run.places(job_id, rest):
                chosen, removed = rest, True
            end = start
        if size == 1 and not removed:
            return chosen, True
        size = max(1, size // 2)


def _free_gpus(snapshot: Snapshot) -> int:
    """GPUs of nodes not lost that no running job holds (at least what the cycle may place on)."""
    cluster = snapshot.cluster
    up = {n.name for n in cluster.nodes if n.state is not NodeState.LOST}
    held = sum(len(r.gpus) for j in snapshot.running for r in j.placement.ranks if r.node in up)
    return cluster.usable_gpus - held


def _gpus_of(e: WhatIf) -> int:
    if isinstance(e, JobEnds):
        return sum(g for _, g in e.frees)
    if isinstance(e, GpusBack):
        return len(e.gpus)
    return e.gpus if isinstance(e, NodeBack) else 0


def _candidates(snapshot: Snapshot, config: SchedulerConfig, job: Job) -> list[WhatIf]:
    """Every event the search may name, in the order it prefers them: running jobs by expected end
    (then those without an estimate, by start), lost or draining nodes back, GPUs out of service
    back in it, the quota it lacks."""
    ordered = sorted(snapshot.running, key=lambda r: (r.expected_end() is None, r.expected_end() or 0.0,
                                                       r.start_time, r.job.id))
    out: list[WhatIf] = [job_ends(r) for r in ordered]
    out.extend(NodeBack(n.name, n.gpu_count) for n in snapshot.cluster.nodes if n.state is not NodeState.READY)
    out.extend(GpusBack(n.name, tuple(sorted(n.out_of_service))) for n in snapshot.cluster.nodes
               if n.out_of_service)
    if config.quotas:
        out.extend(_quota_raises(snapshot, job))
    return out


def _quota_raises(snapshot: Snapshot, job: Job) -> list[QuotaRaised]:
    """For a job over a ceiling or its queue's borrowing limit: the values that admit it, found as
    `quota_check` names them (a ceiling: raised to what it needs; a borrowing limit: the queue's
    guarantee raised to what it needs), one queue at a time up the tree."""
    raised: dict[str, QuotaRaised] = {}
    for _ in range(job.queue.count("/") + 2):  # each queue's ceiling, then its guarantee, at most
        now = apply_events(snapshot, raised.values())
        over = quota_check(now, job)
        q = over.detail("queue") if over is not None else None
        cfg = next((c for c in now.queues if c.name == q), None)
        if over is None or cfg is None or over.code in (ReasonCode.QUEUE_UNKNOWN, ReasonCode.MAX_GPUS_PER_USER):
            break  # (a user's limit is not raised here: one of the user's jobs ending frees it)
        need = int(over.detail("used") or 0) + job.total_gpus
        if over.code is ReasonCode.MAX_GPUS_EXCEEDED:
            raised[cfg.name] = QuotaRaised(cfg.name, cfg.guaranteed_gpus, need)
        else:
            ceiling = None if cfg.max_gpus is None else max(cfg.max_gpus, need)
            raised[cfg.name] = QuotaRaised(cfg.name, need, ceiling)
    return list(raised.values())


def _never(snapshot: Snapshot, job: Job) -> str:
    """Why no event could ever place the job (its shape, its queue), or "" when neither is why."""
    static = static_feasibility(snapshot.cluster, job)
    if static is not None:
        return f"not even an empty cluster of this shape fits it ({static.message})"
    unknown = quota_check(Snapshot(snapshot.now, snapshot.cluster, snapshot.queues, (), ()), job)
    if unknown is not None and unknown.code is ReasonCode.QUEUE_UNKNOWN:
        return unknown.message
    return ""


def _uses(d: Place) -> tuple[tuple[str, int], ...]:
    return tuple((n, len(g)) for n, g in d.placement.gpus_by_node().items())


def _standing(snapshot: Snapshot, config: SchedulerConfig, queues: Sequence[str]) -> tuple[Standing, ...]:
    """The fair-share state of `queues` (in that order, each once), then of every queue that
    borrows beyond its guarantee (reclaim may take those GPUs back)."""
    tree = tree_for(snapshot, config)
    usage = QueueUsage.of(tree, snapshot.running)
    leaves = [q for q in tree.guarantee if q and not tree.children.get(q)]
    borrowing = [q for q in sorted(leaves) if usage.held.get(q, 0) > tree.guarantee[q]]
    out: list[Standing] = []
    for q in [*queues, *borrowing]:
        if tree.known(q) and all(s.queue != q for s in out):
            out.append(Standing(q, usage.held.get(q, 0), tree.guarantee[q], tree.max_gpus(q)))
    return tuple(out)


def _ends_text(e: JobEnds, now: float) -> str:
    if e.job_id.endswith(":releasing"):  # a released attempt whose processes are not confirmed gone
        return f"the GPUs job {e.job_id.rpartition('@')[0]} released are confirmed free"
    return f"job {e.job_id} ends" + ("" if e.end is None else f" (in ~{max(0, int(e.end - now))}s)")


def describe_event(e: WhatIf, hint: Hint, now: float) -> str:
    """One event of a hint in words: for a job ending, the GPUs it frees that the job or the jobs
    ahead of it then use, or the quota its queue regains."""
    if isinstance(e, NodeBack):
        return f"node {e.node} comes back ({e.gpus} GPUs)"
    if isinstance(e, GpusBack):
        named = ", ".join(f"{e.node}:{g}" for g in e.gpus)
        return f"GPU{'s' if len(e.gpus) > 1 else ''} {named} back in service (unhealthy or drained now)"
    if isinstance(e, QuotaRaised):
        ceiling = "" if e.max_gpus is None else f", max_gpus {e.max_gpus}"
        return f"queue {e.queue} set to guaranteed_gpus {e.guaranteed_gpus}{ceiling} (`corral apply`)"
    used = {n for n, _ in hint.uses}
    nodes = [f"{n} frees {g}" for n, g in e.frees if n in used]
    if nodes:
        return f"{', '.join(nodes)} when {_ends_text(e, now)}"
    if _shares_quota(e.queue, hint.job.queue):
        return f"queue {e.queue} regains {sum(g for _, g in e.frees)} GPUs when {_ends_text(e, now)}"
    freed = ", ".join(f"{n} frees {g}" for n, g in e.frees)
    return f"{freed} when {_ends_text(e, now)}"


def _shares_quota(a: str, b: str) -> bool:
    return a == b or b.startswith(a + "/") or a.startswith(b + "/")


def describe(hint: Hint, now: float) -> str:
    """The hint in words, e.g. "needs 1x8 GPUs; node-1 frees 8 when job y ends (in ~200s)"."""
    job = hint.job
    if hint.kind is HintKind.FITS_NOW:
        return "it fits now: it starts at the next scheduling cycle"
    if hint.kind is HintKind.PREEMPTING:
        return f"it preempts job(s) {', '.join(hint.victims)}: it starts once they have checkpointed and stopped"
    if hint.kind is HintKind.NEVER:
        why = hint.never or "no job ending, node coming back or quota change lets it start"
        return f"needs {job.shape}{topology_words(job)}: {why}"
    if hint.kind is HintKind.BEHIND:
        first = ", ".join(f"job {t.job_id} of queue {t.queue}" for t in hint.takers[:3])
        more = f" and {len(hint.takers) - 3} more" if len(hint.takers) > 3 else ""
        return (f"needs {job.shape}{topology_words(job)}: even if every running job ended, the jobs ahead of "
                f"it would start first and leave it no room ({first}{more}); it starts after them")
    text = f"needs {job.shape}{topology_words(job)}; " + "; ".join(describe_event(e, hint, now) for e in hint.events)
    for t in hint.takers:
        text += f"; then job {t.job_id}, ahead of it in queue {t.queue}, takes {t.gpus} of the freed GPUs"
    if hint.victims:
        text += f"; then it preempts job(s) {', '.join(hint.victims)} and starts once they have stopped"
    return text


def fair_share_words(hint: Hint) -> str:
    """The fair-share state behind the hint: the job's queue, the queues of the jobs ahead of it
    that take freed GPUs, and the borrowing queues (none: there is nothing to reclaim)."""
    if not hint.standing:
        return ""
    parts = [s.describe() for s in hint.standing]
    mine = hint.standing[0]
    if mine.queue == hint.job.queue and mine.used < mine.guaranteed and not any(s.borrowed for s in hint.standing):
        parts.append("no queue borrows beyond its guarantee, so there is nothing to reclaim")
    return "fair share: " + "; ".join(parts)


def topology_words(job: Job) -> str:
    gang = job.topology.gang
    if gang is None:
        return ""
    return f" inside one {gang.value}" + (" domain" if gang.value == "nvlink" else "")
