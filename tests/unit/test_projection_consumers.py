"""A service sent only some event types decides as if it had folded them all.

Each deciding service's durable consumer is sent the types its `flow` names (`consumed_by`), and
it folds its own appends; quota and preemption keep no GPU ledger (`ClusterView.gpu_ledger`). The
property: over random logs shaped as the services write them (a job's life: admission, quota
given and taken back, placements, starts, checkpoints, preemptions, releases with their fences
closed at once or later, requeues, ends; jobs interleaved), after every event the service's fold
agrees with the whole log's on everything its decisions read: the core's snapshot (quota's and
preemption's, without fenced GPUs), and per job what quota's round and preemption's requeues
and requests read; and it forgets an ended job no later than the whole log's fold does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.contracts import events as ev
from corral.contracts import flow as fl
from corral.contracts.cluster import parse_cluster_shorthand
from corral.contracts.envelope import Event, Reason, job_stream, node_stream
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.lifecycle import LifecycleCode
from corral.contracts.queues import QueueSpec
from corral.contracts.routes import consumed_by, written_by
from corral.projection import ClusterView, JobView
from corral.services.preemption.service import Preemption
from corral.services.quota.round_inputs import classify
from corral.services.quota.service import Quota

T0 = datetime(2026, 12, 1, tzinfo=UTC)
NODES = ("node-0", "node-1")

#: What the deciding services read of a job, besides the core's snapshot.
READ = ("state", "attempt", "holding", "ranks", "placed_at", "running_since", "attained_gpu_seconds",
        "last_run_seconds", "lost_gpu_seconds", "requeued_at", "preempted_by", "preempted_at", "checkpoint",
        "checkpoint_at", "resume_from", "restarts", "spec", "submitted_at", "preempt", "requeue_request",
        "requeue_attempt", "gang")
QUOTA_READS = ("quota_gpus", "borrowed", "quota_stale", "reason", "waiting_since", "wait_exceeded",
               "cancel_requested")


def _reason(code: str) -> Reason:
    return Reason(code=code, message=code.lower())


@dataclass
class Life:
    """One job's events in the order its writers append them (one list per job; a node's
    GpusReleased may come later than its gang's release: the fence)."""

    job: str
    draw: Callable[[Any], Any]
    events: list[Event] = field(default_factory=list)
    attempt: int = 0
    t: datetime = T0

    def add(self, cls: type[Event], *, stream: str | None = None, **payload: Any) -> None:
        self.t += timedelta(seconds=self.draw(st.integers(1, 30)))
        self.events.append(cls.new(stream=stream or job_stream(self.job), actor="test", correlation_id=self.job,
                                   now=self.t, **payload))

    def job_event(self, cls: type[Event], **payload: Any) -> None:
        self.add(cls, job_id=self.job, **payload)

    def pending(self, code: str) -> None:
        if self.draw(st.booleans()):
            self.job_event(ev.PlacementPending, reason=_reason(code))

    def run(self, gpus: int) -> None:
        self.job_event(ev.JobSubmitted, user="ann", spec=validate_job_spec({
            "name": self.job, "queue": "q", "replicas": 1, "gpus_per_replica": gpus, "runtime": "sim",
            "duration_seconds": 60}))
        self.job_event(ev.JobAdmitted, queue="q", priority=500, replicas=1, gpus_per_replica=gpus)
        for _ in range(3):
            if self.draw(st.booleans()):
                self.job_event(ev.JobHeld, user="bob")
                self.job_event(ev.JobHoldReleased, user="bob")
            self.pending("QUOTA_EXCEEDED")
            self.job_event(ev.QuotaReserved, queue="q", gpus=gpus)
            self.pending("GANG_DOES_NOT_FIT")
            if self.draw(st.booleans()):  # revoked: it would be taken back at once
                self.job_event(ev.QuotaReleased, queue="q", gpus=gpus, reason=_reason("QUOTA_RELEASED"))
                self.pending("WOULD_BE_PREEMPTED")
                self.job_event(ev.QuotaReserved, queue="q", gpus=gpus)
            if not self._attempt(gpus):
                return

    def _attempt(self, gpus: int) -> bool:
        """One placement of the job; True when it is requeued after it."""
        node = self.draw(st.sampled_from(NODES))
        rank = ev.RankPlacement(rank=0, node=node, gpus=list(range(gpus)))
        self.job_event(ev.GangReserved, ranks=[rank], world_size=1, master_addr="10.0.0.1", master_port=29500,
                       attempt=self.attempt)
        self.add(ev.GpusAllocated, stream=node_stream(node), node=node, job_id=self.job, gpus=rank.gpus,
                 attempt=self.attempt)
        started = self.draw(st.booleans())
        if started:
            self.job_event(ev.WorkerStarted, rank=0, node=node, pid=7, attempt=self.attempt)
            self.job_event(ev.JobRunning, attempt=self.attempt)
            if self.draw(st.booleans()):
                self.job_event(ev.CheckpointDone, path=f"/ckpt/{self.attempt}", attempt=self.attempt)
            if self.draw(st.booleans()):
                self.job_event(ev.JobRequeueRequested, user="bob")
        end = self.draw(st.sampled_from(["complete", "fail", "cancel", "preempt", "lost"] if started
                                        else ["cancel", "lost", "fail"]))
        if end == "preempt":
            self.add(ev.PreemptRequested, victim_job_id=self.job, for_job_id="other", deadline=self.t,
                     reason=_reason("PREEMPTED"))
        code = {"complete": LifecycleCode.COMPLETED, "fail": LifecycleCode.RESTARTING, "cancel": "CANCELLED",
                "preempt": LifecycleCode.PREEMPTED, "lost": LifecycleCode.NODE_LOST}[end]
        if started or end != "lost":
            self.job_event(ev.WorkerExited, rank=0, node=node, exit_code=0 if end == "complete" else 1,
                           attempt=self.attempt, reason=_reason(str(code)))
        if end == "cancel":
            self.job_event(ev.JobCancelled, reason=_reason("CANCELLED"))
        self.job_event(ev.GangReleased, reason=_reason(str(code)), attempt=self.attempt)
        freed = lambda: self.add(ev.GpusReleased, stream=node_stream(node), node=node,  # noqa: E731
                                 job_id=self.job, gpus=rank.gpus, attempt=self.attempt)
        late = self.draw(st.booleans())
        if not late:
            freed()
        if end in ("complete", "cancel") or (end == "fail" and self.draw(st.booleans())):
            if end == "complete":
                self.job_event(ev.JobCompleted)
            elif end == "fail":
                self.job_event(ev.JobFailed, reason=_reason("WORKER_FAILED"))
            self.job_event(ev.QuotaReleased, queue="q", gpus=gpus, reason=_reason("QUOTA_RELEASED"))
            if late:
                freed()
            return False
        given_back = self.draw(st.booleans())  # quota's and the requeue's writer race
        if given_back:
            self.job_event(ev.QuotaReleased, queue="q", gpus=gpus, reason=_reason("QUOTA_RELEASED"))
        self.attempt += 1
        self.job_event(ev.JobRequeued, reason=_reason(str(code)), attempt=self.attempt,
                       resume_from=f"/ckpt/{self.attempt - 1}")
        if not given_back:
            self.job_event(ev.QuotaReleased, queue="q", gpus=gpus, reason=_reason("QUOTA_RELEASED"))
        if late:
            freed()
        return True


def _base() -> list[Event]:
    inventories = parse_cluster_shorthand(f"{len(NODES)}x8:H100").inventories()
    out: list[Event] = [ev.QueueConfigured.new(stream="queue-q", actor="quota", queue=QueueSpec(name="q"), now=T0)]
    for name, inv in zip(NODES, inventories, strict=True):
        out.append(ev.NodeRegistered.new(stream=node_stream(name), actor="placement", node=name, gpus=inv.gpus,
                                         nvlink_domains=inv.nvlink_domains, rack=inv.rack, zone=inv.zone, now=T0))
    return out


def _relevant(j: JobView, quota: bool) -> bool:
    return not j.state.terminal or j.holding or (quota and j.quota_gpus > 0)


def _agree(whole: ClusterView, mine: ClusterView, quota: bool) -> None:
    assert mine.active.keys() <= whole.active.keys()  # it forgets an ended job no later: memory bounded
    ids = {i for i, j in whole.active.items() if _relevant(j, quota)}
    assert ids == {i for i, j in mine.active.items() if _relevant(j, quota)}
    for i in ids:
        a, b = whole.active[i], mine.active[i]
        reads = READ + (QUOTA_READS if quota else ("reason",) if a.state.value != "PENDING" else ())
        assert {k: getattr(a, k) for k in reads} == {k: getattr(b, k) for k in reads}, i
        if quota:
            assert classify(a) == classify(b), i
    now = (whole.last_event_at or T0).timestamp()
    assert whole.snapshot(now) == mine.snapshot(now)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_a_service_sent_only_its_types_decides_as_on_the_whole_log(data: st.DataObject) -> None:
    lives = [Life(job=f"job-{k}", draw=data.draw) for k in range(data.draw(st.integers(1, 3)))]
    for k, life in enumerate(lives):
        life.t += timedelta(seconds=k)
        life.run(data.draw(st.sampled_from([1, 2, 8])))
    log = _base()
    while any(life.events for life in lives):  # the jobs' lives interleaved, each in its own order
        life = data.draw(st.sampled_from([life for life in lives if life.events]))
        log.append(life.events.pop(0))
    whole = ClusterView(forget_ended=True)
    folds = {service: (ClusterView(forget_ended=True, gpu_ledger=service.keeps_gpu_ledger),
                       set(consumed_by(service.name)) | set(written_by(service.name)))
             for service in (Quota, Preemption)}
    versions: dict[str, int] = {}
    for event in log:
        versions[event.stream] = version = versions.get(event.stream, 0) + 1
        whole.apply(event, version)
        for service, (view, sent) in folds.items():
            if type(event) in sent:
                view.apply(event, version, gaps=True)
            _agree(whole, view, quota=service.name == fl.QUOTA)
