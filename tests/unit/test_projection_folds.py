"""The projection's folds, table-driven: a job's life as a short script of events, and what the
folded `JobView` must say afterwards.

Every service decides from these folds (placement's fence, preemption's "already asked",
quota's stale reservations, the core's attained service), so each rule has a row here:
- a preemption is counted once per attempt (`preempted_at`), however often it is asked;
- a requeue moves the job back to PENDING with the next attempt, and only RESTARTING uses a
  restart; a requeue of a job that already ended changes nothing;
- a release opens a fence (GPUs stay allocated until the node's GpusReleased), a stale attempt's
  release opens none, and quota held across a release is marked stale until QuotaReleased;
- a wait starts at admission, a requeue or a released hold; its WaitExceeded counts for that
  wait only (a requeued job waits anew, not escalated); one for a job not waiting changes nothing;
- the events of a stream are folded once, in order (duplicates and gaps are reported).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from corral.contracts import events as ev
from corral.contracts.cluster import parse_cluster_shorthand
from corral.contracts.envelope import Event, Reason, job_stream, node_stream
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.lifecycle import LifecycleCode
from corral.contracts.queues import QueueSpec
from corral.core.escalation import to_escalate
from corral.lifecycle import GangState
from corral.projection import Applied, ClusterView, JobState, JobView

JOB = "job-a"
NODE = "node-0"
T0 = datetime(2026, 12, 1, tzinfo=UTC)
STEP_SECONDS = 10.0
"""Each step of a script happens this long after the previous one."""


@dataclass
class Script:
    """Folds a job's events into a fresh view; `attempt` follows the job's requeues."""

    view: ClusterView = field(default_factory=ClusterView)
    attempt: int = 0
    now: datetime = T0

    def job(self, cls: type[Event], **payload: Any) -> None:
        self.view.apply(cls.new(stream=job_stream(JOB), actor="test", correlation_id=JOB, job_id=JOB,
                                now=self.now, **payload))

    def run(self, steps: list[str]) -> JobView:
        inv = parse_cluster_shorthand("1x8:H100").inventories()[0]
        self.view.apply(ev.NodeRegistered.new(stream=node_stream(NODE), actor="agent", node=NODE, gpus=inv.gpus,
                                              nvlink_domains=inv.nvlink_domains, rack=inv.rack, zone=inv.zone,
                                              now=T0))
        self.job(ev.JobSubmitted, spec=validate_job_spec({"name": "a", "queue": "q", "replicas": 2,
                                                          "gpus_per_replica": 4, "runtime": "sim",
                                                          "duration_seconds": 60}))
        self.job(ev.JobAdmitted, queue="q", priority=500, replicas=2, gpus_per_replica=4)
        for step in steps:
            self.now += timedelta(seconds=STEP_SECONDS)
            verb, _, arg = step.partition(":")
            STEPS[verb](self, arg)
        return self.view.jobs[JOB]


def _reason(code: str) -> Reason:
    return Reason(code=code, message=code.lower())


def _quota(s: Script, _: str) -> None:
    s.job(ev.QuotaReserved, queue="q", gpus=8)


def _unquota(s: Script, _: str) -> None:
    s.job(ev.QuotaReleased, queue="q", gpus=8, reason=_reason("RELEASED"))


def _place(s: Script, _: str) -> None:
    s.job(ev.GangReserved, ranks=[ev.RankPlacement(rank=0, node=NODE, gpus=[0, 1, 2, 3]),
                                  ev.RankPlacement(rank=1, node=NODE, gpus=[4, 5, 6, 7])],
          world_size=2, master_addr="127.0.0.1", master_port=29500, attempt=s.attempt)


def _start(s: Script, _: str) -> None:
    for rank in (0, 1):
        s.job(ev.WorkerStarted, rank=rank, node=NODE, pid=10 + rank, attempt=s.attempt)
    s.job(ev.JobRunning, attempt=s.attempt)


def _preempt(s: Script, for_job: str) -> None:
    s.view.apply(ev.PreemptRequested.new(stream=job_stream(JOB), actor="preemption", correlation_id=for_job,
                                         victim_job_id=JOB, for_job_id=for_job, now=s.now,
                                         deadline=s.now + timedelta(seconds=30), reason=_reason("PREEMPTED")))


def _release(s: Script, code: str) -> None:
    """`release:CODE` releases the current attempt; `release@N:CODE` (see STEPS) attempt N."""
    s.job(ev.GangReleased, reason=_reason(code), attempt=s.attempt)


def _release_first(s: Script, code: str) -> None:
    s.job(ev.GangReleased, reason=_reason(code), attempt=0)


def _freed(s: Script, _: str) -> None:
    s.view.apply(ev.GpusReleased.new(stream=node_stream(NODE), actor="placement", correlation_id=JOB, node=NODE,
                                     job_id=JOB, gpus=list(range(8)), attempt=s.attempt, now=s.now))


def _requeue(s: Script, code: str) -> None:
    s.attempt += 1
    s.job(ev.JobRequeued, reason=_reason(code), attempt=s.attempt, resume_from=f"/ckpt/{s.attempt}")


def _end(cls: type[Event], **payload: Any) -> Callable[[Script, str], None]:
    return lambda s, _: s.job(cls, attempt=s.attempt, **payload)


def _hold(s: Script, _: str) -> None:
    s.job(ev.JobHeld, user="bob", message="why not")


def _unhold(s: Script, _: str) -> None:
    s.job(ev.JobHoldReleased, user="bob")


def _escalate(s: Script, _: str) -> None:
    since = s.view.jobs[JOB].waiting_since or s.now
    s.job(ev.WaitExceeded, queue="q", limit_queue="q", attempt=s.attempt, waiting_since=since,
          max_wait_seconds=5.0, waited_seconds=(s.now - since).total_seconds(), blocker=_reason("GANG_DOES_NOT_FIT"))


STEPS: dict[str, Callable[[Script, str], None]] = {
    "hold": _hold, "unhold": _unhold, "escalate": _escalate,
    "quota": _quota, "unquota": _unquota, "place": _place, "start": _start, "preempt": _preempt,
    "release": _release, "release@0": _release_first, "freed": _freed, "requeue": _requeue,
    "complete": _end(ev.JobCompleted), "fail": _end(ev.JobFailed, reason=_reason("WORKER_FAILED")),
}

# What a check reads that is not a plain JobView attribute.
DERIVED: dict[str, Callable[[JobView], Any]] = {
    "times_preempted": lambda j: len(j.preempted_at),
    "fences": lambda j: {a: f.open for a, f in j.fences.items()},
    "escalated": lambda j: j.wait_exceeded is not None,
    "wait_from_step": lambda j: None if j.waiting_since is None
    else round((j.waiting_since - T0).total_seconds() / STEP_SECONDS),
}

ALL_GPUS = {NODE: tuple(range(8))}
RUN = ["quota", "place", "start"]
P, R, C = LifecycleCode.PREEMPTED, LifecycleCode.RESTARTING, LifecycleCode.COMPLETED

CASES: list[tuple[str, list[str], dict[str, Any]]] = [
    ("asked twice in one attempt: one preemption, both preemptors remembered",
     [*RUN, "preempt:b", "preempt:c"],
     {"state": JobState.PREEMPTING, "gang": GangState.PREEMPTING, "times_preempted": 1,
      "preempted_by": {"b", "c"}}),
    ("each attempt's preemption counts once",
     [*RUN, "preempt:b", f"release:{P}", "freed", f"requeue:{P}", "place", "start", "preempt:c", "preempt:c"],
     {"state": JobState.PREEMPTING, "attempt": 1, "times_preempted": 2, "restarts": 0}),
    ("a preemption of a job that holds no GPUs is ignored",
     ["quota", "preempt:b"],
     {"state": JobState.PENDING, "times_preempted": 0, "preempted_by": set(), "gang": None}),
    ("a crash restart requeues with the next attempt and uses a restart; the fence stays open",
     [*RUN, "release:WORKER_FAILED", f"requeue:{R}"],
     {"state": JobState.PENDING, "attempt": 1, "restarts": 1, "ranks": [], "resume_from": "/ckpt/1",
      "holding": False, "fences": {0: ALL_GPUS}, "quota_stale": True}),
    ("a requeue for a lost node uses no restart",
     [*RUN, "release:NODE_LOST", "requeue:NODE_LOST"],
     {"state": JobState.PENDING, "attempt": 1, "restarts": 0}),
    ("a requeue after the job ended changes nothing",
     [*RUN, "release:WORKER_FAILED", "fail", f"requeue:{R}"],
     {"state": JobState.FAILED, "attempt": 0, "restarts": 0}),
    ("a release opens a fence: the GPUs stay allocated to the job",
     [*RUN, f"release:{C}", "complete"],
     {"state": JobState.COMPLETED, "holding": False, "gang": None, "fences": {0: ALL_GPUS}, "active": True}),
    ("the node's GpusReleased closes the fence; with the quota given back nothing is held",
     [*RUN, f"release:{C}", "complete", "freed", "unquota"],
     {"fences": {}, "quota_gpus": 0, "quota_stale": False, "active": False}),
    ("a stale attempt's release opens no fence and leaves the running attempt alone",
     [*RUN, "release:NODE_LOST", "freed", "requeue:NODE_LOST", "place", "start", "release@0:NODE_LOST"],
     {"state": JobState.RUNNING, "attempt": 1, "fences": {}, "gang": GangState.RUNNING}),
    ("quota held across a release is stale until QuotaReleased",
     [*RUN, f"release:{P}"],
     {"state": JobState.REQUEUING, "quota_gpus": 8, "quota_stale": True}),
    ("attained service: GPUs x seconds from JobRunning to the release",
     [*RUN, f"release:{P}"],
     {"attained_gpu_seconds": 8 * STEP_SECONDS}),
    ("a held job gives its quota back and is no longer pending",
     ["quota", "hold"],
     {"state": JobState.HELD, "quota_stale": True, "active": True}),
    ("a released hold waits again, with no reason left",
     ["hold", "unhold"],
     {"state": JobState.PENDING, "reason": None}),
    ("only a pending job is held",
     [*RUN, "hold"],
     {"state": JobState.RUNNING}),
    ("admitted: the wait starts, not escalated",
     [],
     {"wait_from_step": 0, "escalated": False}),
    ("escalated in this wait, with its blocker",
     ["escalate"],
     {"wait_from_step": 0, "escalated": True, "state": JobState.PENDING}),
    ("a requeued job waits anew: the earlier escalation does not count",
     ["escalate", *RUN, f"release:{P}", f"requeue:{P}"],
     {"wait_from_step": 6, "escalated": False, "attempt": 1}),
    ("a released hold waits anew",
     ["escalate", "hold", "unhold"],
     {"wait_from_step": 3, "escalated": False, "state": JobState.PENDING}),
    ("a WaitExceeded for a job not waiting changes nothing",
     [*RUN, "escalate"],
     {"state": JobState.RUNNING, "escalated": False}),
    ("JobRunning moves only a starting gang",
     [*RUN, "preempt:b", "start"],
     {"state": JobState.PREEMPTING, "gang": GangState.PREEMPTING}),
]


@pytest.mark.parametrize(("steps", "expected"), [(s, e) for _, s, e in CASES], ids=[c[0] for c in CASES])
def test_a_jobs_events_fold_into(steps: list[str], expected: dict[str, Any]) -> None:
    job = Script().run(steps)
    got = {k: DERIVED[k](job) if k in DERIVED else getattr(job, k) for k in expected}
    assert got == expected


def test_a_drained_node_takes_no_new_work_and_undrained_takes_it_again() -> None:
    from corral.core import NodeState

    script = Script()
    script.run([])
    drained = ev.NodeDrained.new(stream=node_stream(NODE), actor="user/op", node=NODE, user="op", now=T0)
    script.view.apply(drained)
    assert script.view.cluster().nodes[0].state is NodeState.DRAINING
    assert script.view.nodes[NODE].draining
    script.view.apply(ev.NodeUndrained.new(stream=node_stream(NODE), actor="user/op", node=NODE, user="op", now=T0))
    assert script.view.cluster().nodes[0].state is NodeState.READY


def test_unhealthy_and_drained_gpus_are_out_of_service_until_healthy_and_undrained() -> None:
    from corral.summary import node_rows

    script = Script()
    script.run([])
    view = script.view
    lost = ev.GpuProblem(gpu=3, code="GPU_LOST", message="fell off the bus")
    view.apply(ev.GpuHealthChanged.new(stream=node_stream(NODE), actor="agent", node=NODE, unhealthy=[lost], now=T0))
    view.apply(ev.GpuDrained.new(stream=node_stream(NODE), actor="user/op", node=NODE, gpu=5, user="op",
                                 message="flaky", now=T0))
    assert view.cluster().nodes[0].out_of_service == {3, 5}
    assert view.free_gpus() == 6
    (row,) = node_rows(view)
    assert (row["free"], row["map"]) == (6, ". . . X . D . .")
    assert row["unhealthy"] == {"3": {"code": "GPU_LOST", "message": "fell off the bus", "xid": None}}
    assert row["drained_gpus"] == {"5": {"user": "op", "message": "flaky"}}
    view.apply(ev.GpuHealthChanged.new(stream=node_stream(NODE), actor="agent", node=NODE, unhealthy=[], now=T0))
    view.apply(ev.GpuUndrained.new(stream=node_stream(NODE), actor="user/op", node=NODE, gpu=5, user="op", now=T0))
    assert view.cluster().nodes[0].out_of_service == frozenset() and view.free_gpus() == 8


def test_the_node_map_follows_the_fence() -> None:
    script = Script()
    script.run([*RUN, f"release:{C}", "complete"])
    assert script.view.nodes[NODE].allocations == dict.fromkeys(range(8), JOB)
    _freed(script, "")
    assert script.view.nodes[NODE].allocations == {}
    assert script.view.free_gpus() == 8


@pytest.mark.parametrize(("versions", "results"), [
    ([1, 2, 3], [Applied.APPLIED] * 3),
    ([1, 1, 2], [Applied.APPLIED, Applied.DUPLICATE, Applied.APPLIED]),  # a redelivery is folded once
    ([1, 3], [Applied.APPLIED, Applied.GAP]),  # version 2 is missing: re-read the stream
    ([2, 1], [Applied.GAP, Applied.APPLIED]),
])
def test_each_stream_is_folded_once_and_in_order(versions: list[int], results: list[Applied]) -> None:
    view = ClusterView()
    spec = validate_job_spec({"name": "a", "queue": "q", "runtime": "sim", "duration_seconds": 60})
    got = [view.apply(ev.JobSubmitted.new(stream=job_stream(JOB), actor="t", job_id=JOB, spec=spec, now=T0),
                      version=v) for v in versions]
    assert got == results


def test_a_released_attempt_lost_the_work_since_its_last_checkpoint() -> None:
    """Lost work counts from the last checkpoint (the one written at the preemption signal)."""
    t0 = datetime(2026, 12, 1, tzinfo=UTC)

    def at(seconds: float, cls: type[Event], **payload: Any) -> Event:
        return cls.new(stream=job_stream("v"), actor="t", correlation_id="v", job_id="v",
                       now=t0 + timedelta(seconds=seconds), **payload)

    view = ClusterView()
    spec = validate_job_spec({"name": "v", "queue": "q", "gpus_per_replica": 2, "runtime": "sim",
                              "duration_seconds": 600})
    view.apply(at(0, ev.JobSubmitted, spec=spec))
    view.apply(at(0, ev.JobAdmitted, queue="q", priority=100, replicas=1, gpus_per_replica=2))
    view.apply(at(1, ev.GangReserved, ranks=[ev.RankPlacement(rank=0, node="node-0", gpus=[0, 1])], world_size=1,
                  master_addr="127.0.0.1", master_port=29500))
    view.apply(at(2, ev.JobRunning))
    view.apply(at(127.0, ev.CheckpointDone, path="/c/step-9", step=9, rank=0))
    view.apply(at(127.5, ev.GangReleased, reason=Reason(code="PREEMPTED", message="checkpointed")))
    assert view.jobs["v"].lost_gpu_seconds == 1.0  # 0.5 s x 2 GPUs, not 125.5 s x 2


def test_a_view_rebuilt_from_the_log_escalates_each_wait_once() -> None:
    """What quota does after a restart: the log folded again says which waits were escalated."""
    script = Script()
    script.view.apply(ev.QueueConfigured.new(stream="queue-q", actor="test", queue=QueueSpec(name="q", max_wait=5.0),
                                             now=T0))
    script.run([])
    view, now = script.view, T0.timestamp() + 6
    assert [d.job_id for d in to_escalate(view.waits(), view.max_waits(), now)] == [JOB]
    _escalate(script, "")
    assert to_escalate(view.waits(), view.max_waits(), now + 100) == []
    for step in [*RUN, f"release:{P}", f"requeue:{P}"]:  # requeued: a new wait, escalated again once past
        script.now += timedelta(seconds=STEP_SECONDS)
        STEPS[step.partition(":")[0]](script, step.partition(":")[2])
    since = script.now.timestamp()
    assert to_escalate(view.waits(), view.max_waits(), since + 5) == []
    assert [d.job_id for d in to_escalate(view.waits(), view.max_waits(), since + 5.5)] == [JOB]


def test_the_core_cluster_is_built_again_only_after_a_node_changes() -> None:
    """Admission asks `cluster()` per submission: it is the same object until a node event."""
    from corral.core import NodeState

    script = Script()
    script.run(["quota", "place"])
    view = script.view
    first = view.cluster()
    assert view.cluster() is first  # job events change no node
    view.apply(ev.NodeConditionsChanged.new(stream=node_stream(NODE), actor="agent", node=NODE, now=T0,
                                            conditions=[]))
    assert view.cluster() is first  # the same nodes: the same Cluster object (the core's caches)
    view.apply(ev.NodeLost.new(stream=node_stream(NODE), actor="placement", node=NODE, now=T0,
                               reason=_reason("NODE_LOST")))
    assert view.cluster().nodes[0].state is NodeState.LOST
    inv = parse_cluster_shorthand("2x8:H100").inventories()[1]
    view.apply(ev.NodeRegistered.new(stream=node_stream(inv.node), actor="agent", node=inv.node, gpus=inv.gpus,
                                     nvlink_domains=inv.nvlink_domains, rack=inv.rack, zone=inv.zone, now=T0))
    assert len(view.cluster().nodes) == 2
