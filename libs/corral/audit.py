"""Proof that the log never broke Corral's promises: a pure fold of the events into violations.

Why: "nothing lost, nothing leaked, no GPU used twice" is a claim about every moment of the
cluster's history, not only about its present. The event log is the truth, so the claim can be
checked after the fact by anyone: fold the whole log, and at every position ask the invariants.
A chaos run (tests/chaos, bench/chaos.py) ends with this audit; `corral audit verify` runs it on a
live or restored installation.

This module is pure: entries in, violations out; no clock, no I/O. Each invariant is one `Check`
(observe each entry, then `finish` at the head); `DEFAULT_CHECKS` lists them and `audit` runs any
list of them, so another check (e.g. a hash chain over the stored bytes) is one more class.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Protocol

from corral.contracts import events as ev
from corral.contracts.envelope import Event
from corral.contracts.worker import CHOSEN_EXITS

__all__ = [
    "DEFAULT_CHECKS",
    "AllocationRow",
    "AuditReport",
    "Check",
    "Entry",
    "Invariant",
    "RendezvousPorts",
    "Violation",
    "audit",
    "compare_allocations",
]


class Invariant(StrEnum):
    """What a violation breaks (stable codes: scripts and the chaos run match on them)."""

    GPU_HELD_TWICE = "GPU_HELD_TWICE"              # one GPU allocated to two jobs at once
    GANG_PARTIAL = "GANG_PARTIAL"                  # a reservation not covering every rank, or a
                                                   # JobRunning before every rank started
    TWO_LIVE_ATTEMPTS = "TWO_LIVE_ATTEMPTS"        # a job reserved again while an attempt still holds GPUs
    JOB_LOST = "JOB_LOST"                          # accepted, not terminal, waiting with no reason
    JOB_STUCK = "JOB_STUCK"                        # starting or preempting at the head, for too long
    PREEMPTION_LOOP = "PREEMPTION_LOOP"            # 3+ preemptions of one job within 10 minutes
    ALLOCATIONS_DIFFER = "ALLOCATIONS_DIFFER"      # the allocations table is not the fold of the ledger
    PORT_HELD_TWICE = "PORT_HELD_TWICE"            # one MASTER_ADDR:MASTER_PORT given to two live gangs
    WAIT_ESCALATED_TWICE = "WAIT_ESCALATED_TWICE"  # two WaitExceeded for one wait of a job
    GPU_OUT_OF_SERVICE = "GPU_OUT_OF_SERVICE"      # a GPU allocated while unhealthy or drained

    @property
    def check(self) -> str:
        """The name of the check that finds it."""
        return _CHECK_OF.get(self, "other")



_CHECK_OF = {Invariant.GPU_HELD_TWICE: "gpus", Invariant.GANG_PARTIAL: "gangs",
             Invariant.TWO_LIVE_ATTEMPTS: "gangs", Invariant.JOB_LOST: "accounting",
             Invariant.JOB_STUCK: "accounting", Invariant.PREEMPTION_LOOP: "preemption",
             Invariant.ALLOCATIONS_DIFFER: "allocations_table", Invariant.PORT_HELD_TWICE: "rendezvous",
             Invariant.WAIT_ESCALATED_TWICE: "escalation", Invariant.GPU_OUT_OF_SERVICE: "gpu_service"}


@dataclass(frozen=True, slots=True)
class Entry:
    """One decoded event of the log at its global `position`, with the log's `recorded_at` time."""

    position: int
    recorded_at: datetime
    event: Event


@dataclass(frozen=True, slots=True)
class Violation:
    invariant: Invariant
    position: int  # where it became true (the head position for end-of-log checks)
    message: str
    job_id: str | None = None
    node: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {"invariant": str(self.invariant), "position": self.position, "job_id": self.job_id,
                "node": self.node, "message": self.message}


@dataclass(frozen=True, slots=True)
class AllocationRow:
    """An open row of the `allocations` table (released_by IS NULL)."""

    node: str
    gpu: int
    job_id: str
    attempt: int


class Check(Protocol):
    """One invariant over the log: `observe` every entry in order, then `finish` at the head."""

    name: str

    def observe(self, entry: Entry) -> list[Violation]: ...

    def finish(self, head: Entry | None) -> list[Violation]: ...


# --- GPUs ----------------------------------------------------------------------------------


class GpuLedger:
    """No GPU held by two jobs (or two attempts of one): the node ledgers (GpusAllocated / GpusReleased) folded per GPU.

    A release frees every GPU the job holds on that node, as the database trigger does. The
    fold's open allocations at the head are `held` (compared with the table by the CLI).
    """

    name = "gpus"

    def __init__(self) -> None:
        self.held: dict[tuple[str, int], tuple[str, int, int]] = {}  # (node, gpu) -> (job, attempt, position)

    def observe(self, entry: Entry) -> list[Violation]:
        e = entry.event
        out: list[Violation] = []
        if isinstance(e, ev.GpusAllocated):
            for gpu in e.gpus:
                holder = self.held.get((e.node, gpu))
                if holder is not None and (holder[0], holder[1]) != (e.job_id, e.attempt):
                    out.append(Violation(
                        Invariant.GPU_HELD_TWICE, entry.position,
                        f"GPU {e.node}/{gpu} allocated to {e.job_id} (attempt {e.attempt}) while {holder[0]} "
                        f"(attempt {holder[1]}) holds it since position {holder[2]}", e.job_id, e.node))
                self.held[(e.node, gpu)] = (e.job_id, e.attempt, entry.position)
        elif isinstance(e, ev.GpusReleased):
            for key in [k for k, v in self.held.items() if k[0] == e.node and v[0] == e.job_id]:
                del self.held[key]
        return out

    def finish(self, head: Entry | None) -> list[Violation]:
        return []

    def open_allocations(self) -> set[AllocationRow]:
        return {AllocationRow(node, gpu, job, attempt) for (node, gpu), (job, attempt, _) in self.held.items()}


class GpusInService:
    """No GPU allocated while out of service: unhealthy as its agent last reported it
    (GpuHealthChanged) or drained by an admin (GpuDrained, until GpuUndrained)."""

    name = "gpu_service"

    def __init__(self) -> None:
        self.unhealthy: dict[str, dict[int, str]] = {}  # node -> GPU -> why
        self.drained: set[tuple[str, int]] = set()

    def observe(self, entry: Entry) -> list[Violation]:
        e = entry.event
        if isinstance(e, ev.GpuHealthChanged):
            self.unhealthy[e.node] = {p.gpu: f"unhealthy ({p.code}: {p.message})" for p in e.unhealthy}
        elif isinstance(e, ev.GpuDrained):
            self.drained.add((e.node, e.gpu))
        elif isinstance(e, ev.GpuUndrained):
            self.drained.discard((e.node, e.gpu))
        elif isinstance(e, ev.GpusAllocated):
            out = []
            for gpu in e.gpus:
                why = self.unhealthy.get(e.node, {}).get(gpu) or ("drained" if (e.node, gpu) in self.drained else None)
                if why is not None:
                    out.append(Violation(Invariant.GPU_OUT_OF_SERVICE, entry.position,
                                         f"GPU {e.node}/{gpu} allocated to {e.job_id} (attempt {e.attempt}) while "
                                         f"{why}", e.job_id, e.node))
            return out
        return []

    def finish(self, head: Entry | None) -> list[Violation]:
        return []


class RendezvousPorts:
    """No rendezvous port given to two live gangs: a GangReserved's `master_addr:master_port` is
    held until rank 0's node's GpusReleased of that attempt (its processes are gone), and no other
    gang may be reserved on it meanwhile (`corral.core.rendezvous`)."""

    name = "rendezvous"

    def __init__(self) -> None:
        self.held: dict[tuple[str, int], tuple[str, int, str, int]] = {}  # (addr, port) -> (job, attempt, node, pos)

    def observe(self, entry: Entry) -> list[Violation]:
        e = entry.event
        if isinstance(e, ev.GangReserved):
            key = (e.master_addr, e.master_port)
            holder = self.held.get(key)
            master = min(e.ranks, key=lambda r: r.rank).node
            self.held[key] = (e.job_id, e.attempt, master, entry.position)
            if holder is not None and (holder[0], holder[1]) != (e.job_id, e.attempt):
                return [Violation(Invariant.PORT_HELD_TWICE, entry.position,
                                  f"{e.job_id} (attempt {e.attempt}) rendezvous at {key[0]}:{key[1]}, held by "
                                  f"{holder[0]} (attempt {holder[1]}) since position {holder[3]}", e.job_id, master)]
        elif isinstance(e, ev.GpusReleased):
            for key in [k for k, v in self.held.items() if (v[0], v[1], v[2]) == (e.job_id, e.attempt, e.node)]:
                del self.held[key]
        return []

    def finish(self, head: Entry | None) -> list[Violation]:
        return []


# --- gangs and attempts --------------------------------------------------------------------


@dataclass
class _Attempt:
    attempt: int
    position: int
    world_size: int
    started: set[int] = field(default_factory=set)
    released: bool = False


class GangBarrier:
    """All or nothing: a GangReserved covers every rank 0..N-1 (N = the admitted replicas), and a
    JobRunning comes only after every rank of that attempt started (its WorkerStarted, or an exit
    with a code it chose: 0 or checkpointed). At most one live attempt per job: a job is never
    reserved again while an attempt still holds its GPUs."""

    name = "gangs"

    def __init__(self) -> None:
        self.replicas: dict[str, int] = {}
        self.attempts: dict[str, dict[int, _Attempt]] = defaultdict(dict)

    def _live(self, job_id: str) -> list[_Attempt]:
        return [a for a in self.attempts[job_id].values() if not a.released]

    def observe(self, entry: Entry) -> list[Violation]:
        e, pos = entry.event, entry.position
        out: list[Violation] = []
        if isinstance(e, ev.JobAdmitted):
            self.replicas[e.job_id] = e.replicas
        elif isinstance(e, ev.GangReserved):
            ranks = sorted(r.rank for r in e.ranks)
            want = self.replicas.get(e.job_id, e.world_size)
            if ranks != list(range(e.world_size)) or e.world_size != want:
                out.append(Violation(Invariant.GANG_PARTIAL, pos,
                                     f"{e.job_id} attempt {e.attempt} reserved ranks {ranks} of world size "
                                     f"{e.world_size} (admitted with {want} replicas)", e.job_id))
            live = [a for a in self._live(e.job_id) if a.attempt != e.attempt]
            if live:
                out.append(Violation(Invariant.TWO_LIVE_ATTEMPTS, pos,
                                     f"{e.job_id} attempt {e.attempt} reserved while attempt {live[0].attempt} "
                                     f"(reserved at position {live[0].position}) was never released", e.job_id))
            self.attempts[e.job_id][e.attempt] = _Attempt(e.attempt, pos, e.world_size)
        elif isinstance(e, ev.WorkerStarted) or (
                isinstance(e, ev.WorkerExited) and e.exit_code in CHOSEN_EXITS):
            # A rank that exited with a code it chose ran, even when its report of the start is
            # recorded after the exit (the inbox redelivers each report by its own backoff).
            a = self.attempts[e.job_id].get(e.attempt)
            if a is not None:
                a.started.add(e.rank)
        elif isinstance(e, ev.JobRunning):
            a = self.attempts[e.job_id].get(e.attempt)
            if a is None:
                out.append(Violation(Invariant.GANG_PARTIAL, pos,
                                     f"{e.job_id} running as attempt {e.attempt}, which was never reserved", e.job_id))
            else:
                missing = sorted(set(range(a.world_size)) - a.started)
                if missing:
                    out.append(Violation(Invariant.GANG_PARTIAL, pos,
                                         f"{e.job_id} attempt {e.attempt} running before rank(s) {missing} of "
                                         f"{a.world_size} started", e.job_id))
        elif isinstance(e, ev.GangReleased):
            a = self.attempts[e.job_id].get(e.attempt)
            if a is not None:
                a.released = True
            else:  # a release naming no known attempt frees whatever the job holds
                for a in self._live(e.job_id):
                    a.released = True
        return out

    def finish(self, head: Entry | None) -> list[Violation]:
        return []


# --- nothing lost, nothing stuck -----------------------------------------------------------


class _Phase(StrEnum):
    SUBMITTED = "submitted"    # JobSubmitted, no verdict yet
    WAITING = "waiting"        # admitted or requeued: waits for quota / GPUs
    STARTING = "starting"      # GPUs reserved, barrier not passed
    RUNNING = "running"
    PREEMPTING = "preempting"
    RELEASED = "released"      # GPUs released, the next step (requeue / end) not yet recorded
    TERMINAL = "terminal"


@dataclass
class _Job:
    phase: _Phase
    since: datetime
    position: int
    reason: str | None = None  # why it waits (a code), when it waits
    admitted: bool = False


class Accounting:
    """Every accepted submission (JobAdmitted) is, at the head, terminal, running, or waiting with a
    reason (PlacementPending, QuotaReserved, JobRequeued). A job starting or preempting, or waiting
    without a reason, for longer than `grace` before the head is stuck or lost; jobs that changed
    within `grace` of the head are not judged (the cluster is still deciding). The head's time is
    the last event's, or `now` when given and later (a quiet log has no events to mark time by)."""

    name = "accounting"

    def __init__(self, grace: timedelta = timedelta(seconds=60), now: datetime | None = None) -> None:
        self.grace, self.now = grace, now
        self.jobs: dict[str, _Job] = {}

    def _set(self, entry: Entry, job_id: str, phase: _Phase, reason: str | None = None) -> None:
        j = self.jobs.get(job_id)
        if j is None:
            j = self.jobs[job_id] = _Job(phase, entry.recorded_at, entry.position)
        if j.phase is _Phase.TERMINAL:
            return
        j.phase, j.since, j.position, j.reason = phase, entry.recorded_at, entry.position, reason

    def observe(self, entry: Entry) -> list[Violation]:
        e = entry.event
        if isinstance(e, ev.JobSubmitted):
            if e.job_id not in self.jobs:
                self._set(entry, e.job_id, _Phase.SUBMITTED)
        elif isinstance(e, ev.JobAdmitted):
            self._set(entry, e.job_id, _Phase.WAITING)
            self.jobs[e.job_id].admitted = True
        elif isinstance(e, ev.JobRejected | ev.JobCompleted | ev.JobFailed | ev.JobCancelled):
            self._set(entry, e.job_id, _Phase.TERMINAL)
        elif isinstance(e, ev.QuotaReserved | ev.PlacementPending):
            j = self.jobs.get(e.job_id)
            if j is not None and j.phase is _Phase.WAITING:
                code = "QUOTA_RESERVED" if isinstance(e, ev.QuotaReserved) else str(e.reason.code)
                self._set(entry, e.job_id, _Phase.WAITING, code)
        elif isinstance(e, ev.JobRequeued):
            self._set(entry, e.job_id, _Phase.WAITING, str(e.reason.code))
        elif isinstance(e, ev.JobHeld | ev.JobHoldReleased):
            # held: waits for an operator, with that reason; released: waits again (quota and
            # placement may have nothing new to say about it, it waited before)
            j = self.jobs.get(e.job_id)
            if j is not None and j.phase is _Phase.WAITING:
                self._set(entry, e.job_id, _Phase.WAITING, "HELD" if isinstance(e, ev.JobHeld) else "HOLD_RELEASED")
        elif isinstance(e, ev.GangReserved):
            self._set(entry, e.job_id, _Phase.STARTING)
        elif isinstance(e, ev.JobRunning):
            j = self.jobs.get(e.job_id)
            if j is not None and j.phase is _Phase.STARTING:
                self._set(entry, e.job_id, _Phase.RUNNING)
        elif isinstance(e, ev.PreemptRequested):
            j = self.jobs.get(e.victim_job_id)
            if j is not None and j.phase in (_Phase.STARTING, _Phase.RUNNING):
                self._set(entry, e.victim_job_id, _Phase.PREEMPTING)
        elif isinstance(e, ev.GangReleased):
            self._set(entry, e.job_id, _Phase.RELEASED)
        return []

    def finish(self, head: Entry | None) -> list[Violation]:
        if head is None:
            return []
        out: list[Violation] = []
        at = max(head.recorded_at, self.now) if self.now is not None else head.recorded_at
        for job_id, j in self.jobs.items():
            if not j.admitted and j.phase is not _Phase.SUBMITTED:
                continue
            age = at - j.since
            if j.phase in (_Phase.TERMINAL, _Phase.RUNNING) or age <= self.grace:
                continue
            secs = f"{age.total_seconds():.0f} s"
            if j.phase is _Phase.SUBMITTED:
                out.append(Violation(Invariant.JOB_LOST, j.position,
                                     f"{job_id} submitted {secs} before the head and never admitted or rejected",
                                     job_id))
            elif j.phase is _Phase.WAITING and j.reason is None:
                out.append(Violation(Invariant.JOB_LOST, j.position,
                                     f"{job_id} admitted {secs} before the head; no quota, placement or "
                                     "reason since", job_id))
            elif j.phase is _Phase.RELEASED:
                out.append(Violation(Invariant.JOB_LOST, j.position,
                                     f"{job_id} released {secs} before the head; neither requeued nor ended",
                                     job_id))
            elif j.phase in (_Phase.STARTING, _Phase.PREEMPTING):
                out.append(Violation(Invariant.JOB_STUCK, j.position,
                                     f"{job_id} {j.phase.value} for {secs} at the head (since position "
                                     f"{j.position})", job_id))
        return out


class PreemptionLoop:
    """No job preempted `limit` times (distinct attempts) within `window` of log time."""

    name = "preemption"

    def __init__(self, limit: int = 3, window: timedelta = timedelta(minutes=10)) -> None:
        self.limit, self.window = limit, window
        self.attempt: dict[str, int] = {}
        self.seen: dict[str, deque[tuple[datetime, int]]] = defaultdict(deque)
        self.reported: set[str] = set()

    def observe(self, entry: Entry) -> list[Violation]:
        e = entry.event
        if isinstance(e, ev.GangReserved):
            self.attempt[e.job_id] = e.attempt
            return []
        if not isinstance(e, ev.PreemptRequested):
            return []
        job, attempt = e.victim_job_id, self.attempt.get(e.victim_job_id, -1)
        seen = self.seen[job]
        if seen and seen[-1][1] == attempt:
            return []  # asked again for the same attempt: not another preemption
        seen.append((entry.recorded_at, attempt))
        while seen and entry.recorded_at - seen[0][0] > self.window:
            seen.popleft()
        if len(seen) >= self.limit and job not in self.reported:
            self.reported.add(job)
            span = (entry.recorded_at - seen[0][0]).total_seconds()
            return [Violation(Invariant.PREEMPTION_LOOP, entry.position,
                              f"{job} preempted {len(seen)} times in {span:.0f} s (attempts "
                              f"{[a for _, a in seen]}; last for {e.for_job_id})", job)]
        return []

    def finish(self, head: Entry | None) -> list[Violation]:
        return []


class Escalations:
    """At most one WaitExceeded per wait of a job (`corral.core.escalation`): a wait starts when the
    job is admitted, requeued or released from a hold; quota, restarted or not, never escalates
    the same wait twice. (A WaitExceeded itself is no reason to wait: `Accounting` ignores it.)"""

    name = "escalation"

    def __init__(self) -> None:
        self.escalated: dict[str, int] = {}  # job -> the position of its current wait's WaitExceeded

    def observe(self, entry: Entry) -> list[Violation]:
        e = entry.event
        if isinstance(e, ev.JobAdmitted | ev.JobRequeued | ev.JobHoldReleased):
            self.escalated.pop(e.job_id, None)
        elif isinstance(e, ev.WaitExceeded):
            first = self.escalated.setdefault(e.job_id, entry.position)
            if first != entry.position:
                return [Violation(Invariant.WAIT_ESCALATED_TWICE, entry.position,
                                  f"{e.job_id} escalated again in the wait since {e.waiting_since.isoformat()} "
                                  f"(first at position {first})", e.job_id)]
        return []

    def finish(self, head: Entry | None) -> list[Violation]:
        return []


# --- the run -------------------------------------------------------------------------------


def compare_allocations(fold: set[AllocationRow], table: Iterable[AllocationRow],
                        position: int) -> list[Violation]:
    """The `allocations` table's open rows against the fold of the ledger at the head."""
    rows = set(table)
    out = []
    for row in sorted(fold - rows, key=lambda r: (r.node, r.gpu)):
        out.append(Violation(Invariant.ALLOCATIONS_DIFFER, position,
                             f"the log holds {row.node}/{row.gpu} for {row.job_id} (attempt {row.attempt}); "
                             "the allocations table does not", row.job_id, row.node))
    for row in sorted(rows - fold, key=lambda r: (r.node, r.gpu)):
        out.append(Violation(Invariant.ALLOCATIONS_DIFFER, position,
                             f"the allocations table holds {row.node}/{row.gpu} for {row.job_id} (attempt "
                             f"{row.attempt}); the log does not", row.job_id, row.node))
    return out


DEFAULT_CHECKS: tuple[Callable[[], Check], ...] = (GpuLedger, GpusInService, RendezvousPorts, GangBarrier,
                                                   Accounting, PreemptionLoop, Escalations)
"""The invariants `corral audit verify` folds; add a factory here (or pass more to `audit`)."""


@dataclass
class AuditReport:
    events: int
    head_position: int
    violations: list[Violation]
    checks: list[Check]
    counts: dict[str, int] = field(default_factory=dict)  # event type -> how many

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def first(self) -> Violation | None:
        return min(self.violations, key=lambda v: v.position) if self.violations else None

    def by_invariant(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for v in self.violations:
            out[str(v.invariant)] = out.get(str(v.invariant), 0) + 1
        return out

    def ledger(self) -> GpuLedger | None:
        return next((c for c in self.checks if isinstance(c, GpuLedger)), None)


def audit(entries: Iterable[Entry], checks: Sequence[Check] | None = None) -> AuditReport:
    """Fold `entries` (in position order) through every check; violations in position order."""
    active: list[Check] = list(checks) if checks is not None else [make() for make in DEFAULT_CHECKS]
    violations: list[Violation] = []
    counts: dict[str, int] = {}
    head: Entry | None = None
    n = 0
    for entry in entries:
        n += 1
        head = entry
        counts[entry.event.type] = counts.get(entry.event.type, 0) + 1
        for check in active:
            violations.extend(check.observe(entry))
    for check in active:
        violations.extend(check.finish(head))
    violations.sort(key=lambda v: v.position)
    return AuditReport(events=n, head_position=head.position if head else 0, violations=violations,
                       checks=active, counts=counts)
