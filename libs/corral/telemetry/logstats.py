"""Counters and latency histograms of the log: how many reservations, preemptions, requeues and
failures, and how long jobs waited, counted from the events as a service folds them.

Why: a counter incremented where a service decides something counts only what this
process decided since it started; a standby that takes over starts from zero, and two replicas
disagree. Counted from the fold instead, every process that folds the same log reports the same
totals, a restarted one reports them again once rebuilt (Prometheus sees no reset: the figures
never go down), and they agree with `corral events`. `LogStatistics.observe` is called once per
event folded into the view (`Applied.APPLIED`, never for a duplicate), after the view took it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from corral.contracts import events as ev
from corral.contracts.envelope import Event
from corral.contracts.lifecycle import LifecycleCode
from corral.projection import ClusterView, JobState

#: Seconds: from a second (a quiet cluster) to a day (a backlog).
WAIT_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0,
                21600.0, 86400.0)
#: A release with one of these codes lost no work.
_NOTHING_LOST = frozenset({LifecycleCode.COMPLETED.value, LifecycleCode.CHECKPOINTED.value})


@dataclass
class _Running:
    since: float
    gpus: int
    checkpoint: float | None = None


class LogStatistics:
    """The log's counters and wait histograms, in `registry` (names in the Kueue style)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.quota_reserved = Counter("corral_quota_reservations", "Quota reservations (QuotaReserved), by queue.",
                                      ["queue"], registry=registry)
        self.admission = Counter("corral_admission_attempts", "Submissions judged by admission, by result "
                                 "(admitted, rejected).", ["result"], registry=registry)
        self.preemptions = Counter("corral_preemptions", "Preemptions asked (PreemptRequested), by the victim's "
                                   "queue and the reason code.", ["queue", "reason"], registry=registry)
        self.requeues = Counter("corral_job_requeues", "Jobs requeued (JobRequeued: preempted, restarted after a "
                                "crash, node or workers lost, start timeout), by queue and reason code.",
                                ["queue", "reason"], registry=registry)
        self.failures = Counter("corral_job_failures", "Jobs failed (JobFailed), by queue and reason code.",
                                ["queue", "reason"], registry=registry)
        self.ended = Counter("corral_jobs_ended", "Jobs that ended, by queue and final state (COMPLETED, FAILED, "
                             "CANCELLED, REJECTED).", ["queue", "state"], registry=registry)
        self.lost = Counter("corral_lost_gpu_seconds", "GPU-seconds of work lost when a gang was released before "
                            "its end (since its last checkpoint), by queue and release reason.",
                            ["queue", "reason"], registry=registry)
        self.wait_quota = self._wait(registry, "corral_job_wait_to_quota_seconds",
                                     "Seconds from submit (or requeue) to quota reservation, by queue.")
        self.wait_placement = self._wait(registry, "corral_job_wait_to_placement_seconds",
                                         "Seconds from submit (or requeue) to placement (GangReserved), by queue.")
        self.wait_running = self._wait(registry, "corral_job_wait_to_running_seconds",
                                       "Seconds from submit (or requeue) to running (JobRunning), by queue.")
        self._waiting: dict[str, float] = {}  # job -> when it last started waiting
        self._running: dict[str, _Running] = {}
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._handlers: dict[type[Event], Callable[[ClusterView, Any], None]] = {
            ev.JobSubmitted: self._submitted, ev.JobAdmitted: self._admitted, ev.JobRejected: self._rejected,
            ev.QuotaReserved: self._quota_reserved, ev.GangReserved: self._gang_reserved,
            ev.JobRunning: self._running_, ev.CheckpointDone: self._checkpoint, ev.PreemptRequested: self._preempt,
            ev.GangReleased: self._released, ev.JobRequeued: self._requeued, ev.JobFailed: self._failed,
            ev.JobCompleted: self._completed, ev.JobCancelled: self._cancelled,
        }

    @staticmethod
    def _wait(registry: CollectorRegistry, name: str, help_: str) -> Histogram:
        return Histogram(name, help_, ["queue"], buckets=WAIT_BUCKETS, registry=registry)

    def observe(self, view: ClusterView, event: Event) -> None:
        """Count one event the view has just folded (a few microseconds: called on every fold)."""
        handler = self._handlers.get(type(event))
        if handler is not None:
            handler(view, event)

    def _child(self, metric: Counter | Histogram, *labels: str) -> Any:
        """`metric.labels(*labels)`, remembered (`labels()` takes a lock and checks its arguments)."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    # ---- one handler per event type --------------------------------------------------------------
    def _submitted(self, view: ClusterView, event: ev.JobSubmitted) -> None:
        self._waiting[event.job_id] = event.occurred_at.timestamp()

    def _admitted(self, view: ClusterView, event: ev.JobAdmitted) -> None:
        self._child(self.admission, "admitted").inc()

    def _rejected(self, view: ClusterView, event: ev.JobRejected) -> None:
        self._child(self.admission, "rejected").inc()
        self._ended(view, event.job_id, JobState.REJECTED)

    def _quota_reserved(self, view: ClusterView, event: ev.QuotaReserved) -> None:
        self._child(self.quota_reserved, event.queue).inc()
        self._waited(self.wait_quota, view, event, done=False)

    def _gang_reserved(self, view: ClusterView, event: ev.GangReserved) -> None:
        self._waited(self.wait_placement, view, event, done=False)

    def _running_(self, view: ClusterView, event: ev.JobRunning) -> None:
        self._waited(self.wait_running, view, event, done=True)
        job = view.jobs.get(event.job_id)
        if job is not None and job.state is JobState.RUNNING:
            self._running[event.job_id] = _Running(since=event.occurred_at.timestamp(), gpus=job.gpus)

    def _checkpoint(self, view: ClusterView, event: ev.CheckpointDone) -> None:
        running, job = self._running.get(event.job_id), view.jobs.get(event.job_id)
        if running is not None and job is not None and job.attempt == event.attempt:  # as the projection
            running.checkpoint = event.occurred_at.timestamp()

    def _preempt(self, view: ClusterView, event: ev.PreemptRequested) -> None:
        job = view.jobs.get(event.victim_job_id)
        code, at = event.reason.code, event.occurred_at.timestamp()
        # a new preemption (a repeated request for the same attempt records no new time)
        if job is not None and job.preempt is event and job.preempted_at and job.preempted_at[-1] == at:
            self._child(self.preemptions, job.queue, code).inc()

    def _released(self, view: ClusterView, event: ev.GangReleased) -> None:
        running = self._running.pop(event.job_id, None)
        if running is not None and event.reason.code not in _NOTHING_LOST:
            start = max(running.since, running.checkpoint or running.since)
            lost = max(0.0, event.occurred_at.timestamp() - start) * running.gpus
            self._child(self.lost, _queue(view, event.job_id), event.reason.code).inc(lost)

    def _requeued(self, view: ClusterView, event: ev.JobRequeued) -> None:
        self._waiting[event.job_id] = event.occurred_at.timestamp()
        self._child(self.requeues, _queue(view, event.job_id), event.reason.code).inc()

    def _failed(self, view: ClusterView, event: ev.JobFailed) -> None:
        self._child(self.failures, _queue(view, event.job_id), event.reason.code).inc()
        self._ended(view, event.job_id, JobState.FAILED)

    def _completed(self, view: ClusterView, event: ev.JobCompleted) -> None:
        self._ended(view, event.job_id, JobState.COMPLETED)

    def _cancelled(self, view: ClusterView, event: ev.JobCancelled) -> None:
        self._ended(view, event.job_id, JobState.CANCELLED)

    def _waited(self, histogram: Histogram, view: ClusterView, event: ev.QuotaReserved | ev.GangReserved |
                ev.JobRunning, *, done: bool) -> None:
        since = self._waiting.pop(event.job_id, None) if done else self._waiting.get(event.job_id)
        if since is not None:
            waited = max(0.0, event.occurred_at.timestamp() - since)
            self._child(histogram, _queue(view, event.job_id)).observe(waited)

    def _ended(self, view: ClusterView, job_id: str, state: JobState) -> None:
        self._waiting.pop(job_id, None)
        self._running.pop(job_id, None)
        self._child(self.ended, _queue(view, job_id), state.value).inc()


def _queue(view: ClusterView, job_id: str) -> str:
    job = view.jobs.get(job_id)
    return job.queue if job is not None else "?"
