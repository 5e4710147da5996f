"""The projection's fold of a released gang: its GPUs stay allocated (the fence) until each node's
GpusReleased; reports that arrive after the release are recorded for the fence, never reviving the
job; the core sees fenced GPUs as on their way out."""

from __future__ import annotations

from typing import Any

from corral import core
from corral.cli.present import node_rows
from corral.contracts import events as ev
from corral.contracts.cluster import parse_cluster_shorthand
from corral.contracts.envelope import Event, Reason, job_stream, node_stream
from corral.contracts.jobspec import validate_job_spec
from corral.lifecycle import GangState
from corral.projection import ClusterView, JobState

JOB = "job-a"


def job_event(cls: type[Event], **payload: Any) -> Event:
    return cls.new(stream=job_stream(JOB), actor="test", correlation_id=JOB, job_id=JOB, **payload)


def fold(view: ClusterView, *events: Event) -> None:
    for e in events:
        view.apply(e)


def gang_events() -> tuple[list[Event], list[Event]]:
    """A 2x4 gang placed and running on one node; then rank 0 crashes, the gang is released, the job fails."""
    inv = parse_cluster_shorthand("1x8:H100").inventories()[0]
    running = [
        ev.NodeRegistered.new(stream=node_stream(inv.node), actor="agent", node=inv.node, gpus=inv.gpus,
                              nvlink_domains=inv.nvlink_domains, rack=inv.rack, zone=inv.zone),
        job_event(ev.JobSubmitted, spec=validate_job_spec({"name": "a", "queue": "q", "replicas": 2,
                                                           "gpus_per_replica": 4, "runtime": "sim",
                                                           "duration_seconds": 60})),
        job_event(ev.JobAdmitted, queue="q", priority=500, replicas=2, gpus_per_replica=4),
        job_event(ev.GangReserved, ranks=[ev.RankPlacement(rank=0, node=inv.node, gpus=[0, 1, 2, 3]),
                                          ev.RankPlacement(rank=1, node=inv.node, gpus=[4, 5, 6, 7])],
                  world_size=2, master_addr="127.0.0.1", master_port=29500),
        job_event(ev.WorkerStarted, rank=0, node=inv.node, pid=10),
        job_event(ev.WorkerStarted, rank=1, node=inv.node, pid=11),
        job_event(ev.JobRunning)]
    crashed = [
        job_event(ev.WorkerExited, rank=0, node=inv.node, exit_code=3, reason=Reason(code="CRASHED", message="3")),
        job_event(ev.GangReleased, reason=Reason(code="WORKER_FAILED", message="rank 0 exited with 3")),
        job_event(ev.JobFailed, reason=Reason(code="WORKER_FAILED", message="no restarts left"))]
    return running, crashed


def crashed_gang() -> ClusterView:
    view = ClusterView()
    running, crashed = gang_events()
    fold(view, *running)
    assert view.jobs[JOB].gang is GangState.RUNNING
    fold(view, *crashed)
    return view


def test_a_released_gang_keeps_its_gpus_until_its_node_confirms() -> None:
    view = crashed_gang()
    job = view.jobs[JOB]
    assert job.state is JobState.FAILED and not job.holding and job.gang is None
    assert list(job.fences) == [0] and job.fences[0].open == {"node-0": tuple(range(8))}
    assert job.active, "a job with fenced GPUs is still looked at by placement"
    assert view.free_gpus() == 0 and view.releasing_gpus() == {"node-0": dict.fromkeys(range(8), JOB)}
    (row,) = node_rows(view)
    assert len(row["releasing"]) == 8 and row["map"].count("~") == 8
    # the core sees them as GPUs on their way out, under an id of their own
    (fenced,) = view.snapshot(0.0, pending=[], releasing=True).running
    assert fenced.preempting and fenced.job.id == f"{JOB}@0:releasing" and fenced.placement.gpu_count == 8
    assert view.snapshot(0.0, pending=[]).running == ()


def test_a_late_exit_is_recorded_for_the_fence_without_reviving_the_job() -> None:
    view = crashed_gang()
    fold(view, job_event(ev.WorkerExited, rank=1, node="node-0", exit_code=None,
                         reason=Reason(code="STOPPED", message="killed by SIGTERM")))
    job = view.jobs[JOB]
    assert job.fences[0].exits == {0: 3, 1: None}
    assert job.state is JobState.FAILED and not job.holding


def test_the_nodes_gpus_released_frees_them_and_closes_the_fence() -> None:
    view = crashed_gang()
    fold(view, ev.GpusReleased.new(stream=node_stream("node-0"), actor="placement", correlation_id=JOB,
                                   node="node-0", job_id=JOB, gpus=list(range(8))))
    job = view.jobs[JOB]
    assert not job.fences and not job.active and view.free_gpus() == 8 and view.releasing_gpus() == {}
    assert isinstance(view.snapshot(0.0, pending=[], releasing=True), core.Snapshot)


def test_the_jobs_holding_gpus_and_the_fenced_ones_are_kept_as_events_are_folded() -> None:
    """`running_jobs` and `fenced_jobs` are kept once first asked for (placement asked them of
    every active job on every reconcile); they follow every event, as a scan of the jobs would."""
    view = ClusterView()
    assert view.running_jobs() == [] and view.fenced_jobs() == []  # built now, on an empty view

    def scanned() -> tuple[set[str], set[str]]:
        return ({j.job_id for j in view.active.values() if j.holding},
                {j.job_id for j in view.active.values() if j.fences})

    def kept() -> tuple[set[str], set[str]]:
        return {j.job_id for j in view.running_jobs()}, {j.job_id for j in view.fenced_jobs()}

    running, crashed = gang_events()
    for event in running + crashed:  # one at a time, the indexes checked after each
        fold(view, event)
        assert kept() == scanned()
    assert kept() == (set(), {JOB})
    fold(view, ev.GpusReleased.new(stream=node_stream("node-0"), actor="placement", correlation_id=JOB,
                                   node="node-0", job_id=JOB, gpus=list(range(8))))
    assert kept() == scanned() == (set(), set())



def test_a_node_streams_allocation_is_folded_without_its_gang() -> None:
    """Placement is not sent its own events; after a lost race on a node's stream it re-reads that
    stream only, and must learn from the GpusAllocated there that a deposed leader gave GPUs out."""
    running, _ = gang_events()
    view = ClusterView()
    fold(view, running[0])  # the node, registered
    fold(view, ev.GpusAllocated.new(stream=node_stream("node-0"), actor="placement", correlation_id=JOB,
                                    node="node-0", job_id=JOB, gpus=[0, 1, 2, 3]))
    assert view.free_gpus() == 4 and view.nodes["node-0"].allocations == dict.fromkeys(range(4), JOB)
    fold(view, *running[1:])  # then its gang, from the job's stream: the same allocation
    assert view.free_gpus() == 0


def test_a_checkpoint_reported_late_by_a_requeued_attempt_is_never_the_jobs_resume_point() -> None:
    """A host cut off from the cluster keeps running its ranks; once back, its agent reports the
    checkpoints they wrote meanwhile. The job was requeued past that attempt and resumed from an
    earlier checkpoint: the old attempt's later ones belong to a run that diverged, and the next
    requeue must resume from the current attempt's (or the one it resumed from)."""
    running, _ = gang_events()
    view = ClusterView()
    fold(view, *running, job_event(ev.CheckpointDone, path="/c/attempt0-step5", step=5, rank=0),
         job_event(ev.GangReleased, reason=Reason(code="NODE_LOST", message="node-0 lost")),
         job_event(ev.JobRequeued, attempt=1, resume_from="/c/attempt0-step5",
                   reason=Reason(code="NODE_LOST", message="node-0 lost")))
    assert view.jobs[JOB].checkpoint == "/c/attempt0-step5"
    fold(view, job_event(ev.CheckpointDone, path="/c/attempt0-step90", step=90, rank=0, attempt=0))
    assert view.jobs[JOB].checkpoint == "/c/attempt0-step5", "the requeued attempt's late report moves nothing"
    fold(view, job_event(ev.GangReserved, ranks=[ev.RankPlacement(rank=0, node="node-0", gpus=[0, 1, 2, 3]),
                                                 ev.RankPlacement(rank=1, node="node-0", gpus=[4, 5, 6, 7])],
                         world_size=2, master_addr="127.0.0.1", master_port=29500, attempt=1,
                         resume_from="/c/attempt0-step5"),
         job_event(ev.CheckpointDone, path="/c/attempt1-step8", step=8, rank=0, attempt=1),
         job_event(ev.CheckpointDone, path="/c/attempt0-step95", step=95, rank=0, attempt=0))
    assert view.jobs[JOB].checkpoint == "/c/attempt1-step8"
