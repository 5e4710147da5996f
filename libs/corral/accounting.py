"""Who used what: GPU-hours used, waited, and lost to preemption and to failures, from the log.

Why: a platform team is asked "which team used the GPUs last month, how long did they
wait, and how much did preemptions and crashes throw away?" (Slurm's `sreport`/`sacct`). The
answer must come from the event log alone, so that it is the same whenever it is computed and
whoever computes it, and never from a counter a process kept.

Definitions (GPU-seconds; `GpuHours` divides by 3600), each clipped to the window [since, until):
- used: a gang's GPUs on each node, from its GangReserved until that node's GpusReleased for the
  attempt (the GPU is busy until its processes are gone), or until the window's end;
- waited: the job's GPUs times the time it waited for a place: from JobAdmitted, or from each
  JobRequeued, until the next GangReserved (or until it ended: cancelled, failed, or the window);
- lost to preemption: an attempt released for PREEMPTED or PREEMPT_OVERRUN, its GPUs times the
  time from its last progress (the attempt's GangReserved, or its latest CheckpointDone) to the
  GangReleased: the work it will do again;
- lost to failures: the same for an attempt released for a failure (a crashed worker, a start
  timeout, a node or its workers lost, the cluster restarted under it).

Pure: events in (in log order), figures out; no clock (the caller says when "until" is), no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from corral.contracts import events as ev
from corral.contracts.envelope import Event
from corral.contracts.flow import names
from corral.contracts.lifecycle import LifecycleCode

PREEMPTION_CODES = frozenset({LifecycleCode.PREEMPTED.value, LifecycleCode.PREEMPT_OVERRUN.value})
FAILURE_CODES = frozenset({LifecycleCode.WORKER_FAILED.value, LifecycleCode.START_TIMEOUT.value,
                           LifecycleCode.NODE_LOST.value, LifecycleCode.WORKERS_LOST.value,
                           LifecycleCode.CLUSTER_RESTARTED.value})

#: The event types the figures are computed from (a reader may fetch only these).
EVENT_TYPES = names((ev.JobSubmitted, ev.JobAdmitted, ev.JobRequeued, ev.GangReserved, ev.CheckpointDone,
                     ev.GpusReleased, ev.GangReleased, ev.JobCancelled, ev.JobFailed, ev.JobCompleted,
                     ev.JobRejected))


class GroupBy(StrEnum):
    QUEUE = "queue"
    USER = "user"
    JOB = "job"


@dataclass(frozen=True)
class Window:
    """[since, until): `since` None means from the beginning of the log."""

    until: datetime
    since: datetime | None = None

    def seconds(self, start: datetime, end: datetime | None) -> float:
        """The part of [start, end) inside the window, in seconds (end None: still going)."""
        lo = start if self.since is None else max(start, self.since)
        hi = self.until if end is None else min(end, self.until)
        return max(0.0, (hi - lo).total_seconds())


@dataclass
class JobUsage:
    """One job's figures in GPU-seconds."""

    job_id: str
    queue: str = "?"
    user: str = "?"
    gpus: int = 0
    used: float = 0.0
    waited: float = 0.0
    lost_preemption: float = 0.0
    lost_failure: float = 0.0


@dataclass
class _Attempt:
    placed_at: datetime
    gpus: int
    nodes: dict[str, tuple[int, datetime | None]] = field(default_factory=dict)  # node -> (gpus, released at)
    progress_at: datetime | None = None


@dataclass
class _Job:
    usage: JobUsage
    waiting_since: datetime | None = None
    attempts: dict[int, _Attempt] = field(default_factory=dict)


class _Fold:
    def __init__(self, window: Window) -> None:
        self.window = window
        self.jobs: dict[str, _Job] = {}

    def job(self, job_id: str) -> _Job:
        known = self.jobs.get(job_id)
        if known is None:
            known = self.jobs[job_id] = _Job(JobUsage(job_id))
        return known

    def stop_waiting(self, job: _Job, at: datetime) -> None:
        if job.waiting_since is not None:
            job.usage.waited += job.usage.gpus * self.window.seconds(job.waiting_since, at)
            job.waiting_since = None

    def apply(self, event: Event) -> None:
        at = event.occurred_at
        if isinstance(event, ev.JobSubmitted):
            u = self.job(event.job_id).usage
            u.queue, u.user, u.gpus = event.spec.queue, event.user or "?", event.spec.total_gpus
        elif isinstance(event, ev.JobAdmitted):
            j = self.job(event.job_id)
            j.usage.queue, j.usage.gpus = event.queue, event.replicas * event.gpus_per_replica
            j.waiting_since = at
        elif isinstance(event, ev.JobRequeued):
            j = self.job(event.job_id)
            if j.waiting_since is None:
                j.waiting_since = at
        elif isinstance(event, ev.GangReserved):
            j = self.job(event.job_id)
            self.stop_waiting(j, at)
            attempt = _Attempt(placed_at=at, gpus=sum(len(r.gpus) for r in event.ranks), progress_at=at)
            for r in event.ranks:
                held, _ = attempt.nodes.get(r.node, (0, None))
                attempt.nodes[r.node] = (held + len(r.gpus), None)
            j.attempts[event.attempt] = attempt
        elif isinstance(event, ev.CheckpointDone):
            a = self.job(event.job_id).attempts.get(event.attempt)
            if a is not None:
                a.progress_at = at
        elif isinstance(event, ev.GpusReleased):
            a = self.job(event.job_id).attempts.get(event.attempt)
            if a is not None and event.node in a.nodes and a.nodes[event.node][1] is None:
                a.nodes[event.node] = (a.nodes[event.node][0], at)
        elif isinstance(event, ev.GangReleased):
            self.released(self.job(event.job_id), event)
        elif isinstance(event, ev.JobCancelled | ev.JobFailed | ev.JobCompleted | ev.JobRejected):
            self.stop_waiting(self.job(event.job_id), at)

    def released(self, job: _Job, event: ev.GangReleased) -> None:
        a = job.attempts.get(event.attempt)
        if a is None:
            return
        lost = a.gpus * self.window.seconds(a.progress_at or a.placed_at, event.occurred_at)
        if event.reason.code in PREEMPTION_CODES:
            job.usage.lost_preemption += lost
        elif event.reason.code in FAILURE_CODES:
            job.usage.lost_failure += lost

    def finish(self) -> dict[str, JobUsage]:
        for j in self.jobs.values():
            self.stop_waiting(j, self.window.until)
            for a in j.attempts.values():
                j.usage.used += sum(gpus * self.window.seconds(a.placed_at, released)
                                    for gpus, released in a.nodes.values())
        return {job_id: j.usage for job_id, j in self.jobs.items()}


def job_usage(events: Iterable[Event], window: Window) -> dict[str, JobUsage]:
    """Each job's figures over `window`, from the log's events in order (others are ignored)."""
    fold = _Fold(window)
    for event in events:
        if event.occurred_at >= window.until:
            continue  # after the window: nothing in it (an interval it would close ends at `until`)
        fold.apply(event)
    return fold.finish()


@dataclass(frozen=True)
class UsageRow:
    """Figures of one group (a queue, a user or a job) in GPU-hours."""

    key: str
    jobs: int
    used: float
    waited: float
    lost_preemption: float
    lost_failure: float

    def as_dict(self, by: GroupBy) -> dict[str, object]:
        return {by.value: self.key, "jobs": self.jobs, "used_gpu_hours": self.used,
                "waited_gpu_hours": self.waited, "lost_to_preemption_gpu_hours": self.lost_preemption,
                "lost_to_failures_gpu_hours": self.lost_failure}


def _key(u: JobUsage, by: GroupBy) -> str:
    return {GroupBy.QUEUE: u.queue, GroupBy.USER: u.user, GroupBy.JOB: u.job_id}[by]


def grouped(usages: Iterable[JobUsage], by: GroupBy) -> list[UsageRow]:
    """Rows per group, sorted by key, figures in GPU-hours; jobs with nothing in the window
    (all four figures zero) are left out."""
    sums: dict[str, list[float]] = {}
    for u in usages:
        figures = (u.used, u.waited, u.lost_preemption, u.lost_failure)
        if not any(figures):
            continue
        row = sums.setdefault(_key(u, by), [0, 0.0, 0.0, 0.0, 0.0])
        row[0] += 1
        for i, value in enumerate(figures, start=1):
            row[i] += value
    return [UsageRow(key, int(s[0]), s[1] / 3600, s[2] / 3600, s[3] / 3600, s[4] / 3600)
            for key, s in sorted(sums.items())]


def total(rows: Iterable[UsageRow]) -> UsageRow:
    rows = list(rows)
    return UsageRow("TOTAL", sum(r.jobs for r in rows), sum(r.used for r in rows), sum(r.waited for r in rows),
                    sum(r.lost_preemption for r in rows), sum(r.lost_failure for r in rows))
