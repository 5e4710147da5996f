"""`corral sim --from-log` turns the event log into the simulator's ordinary inputs."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

from corral.contracts import events as ev
from corral.contracts.envelope import Reason
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.queues import QueueSpec
from corral.sim.from_log import export_inputs, workload_from_events

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_submissions_become_jobs_with_their_real_durations_and_relative_submit_times() -> None:
    spec = validate_job_spec(
        {"name": "x", "queue": "a", "runtime": "process", "command": ["python"], "replicas": 2, "gpus_per_replica": 4}
    )
    common = {"actor": "t", "correlation_id": "j1"}
    events = [
        ev.NodeRegistered.new(
            stream="node-n0",
            actor="agent",
            node="n0",
            now=at(0),
            gpus=[{"index": i, "model": "H100", "memory_gib": 80} for i in range(8)],  # type: ignore[misc]
            nvlink_domains=[list(range(8))],
            rack="r0",
            zone="z0",
        ),
        ev.QueueConfigured.new(stream="queue-a", actor="u", queue=QueueSpec(name="a", guaranteed_gpus=8), now=at(0)),
        ev.JobSubmitted.new(stream="job-j1", job_id="j1", spec=spec, now=at(10), **common),
        ev.JobRunning.new(stream="job-j1", job_id="j1", now=at(15), **common),
        ev.JobCompleted.new(stream="job-j1", job_id="j1", now=at(75), **common),
        ev.JobSubmitted.new(stream="job-j2", job_id="j2", spec=spec, now=at(20), actor="t", correlation_id="j2"),
        ev.JobSubmitted.new(stream="job-j3", job_id="j3", spec=spec, now=at(30), actor="t", correlation_id="j3"),
        ev.JobRejected.new(
            stream="job-j3",
            job_id="j3",
            now=at(30),
            actor="t",
            correlation_id="j3",
            reason=Reason(code="QUEUE_UNKNOWN", message="no"),
        ),
    ]
    lines, cluster, queues = workload_from_events(events)
    got = [(j["name"], j["submit_at"], j["duration_seconds"]) for j in lines]
    assert got == [("j1", 0.0, 60.0), ("j2", 10.0, 60.0)]
    assert all(j["runtime"] == "sim" and "command" not in j for j in lines)
    assert cluster["nodes"][0]["name"] == "n0" and len(cluster["nodes"][0]["gpus"]) == 8
    assert queues["queues"][0]["name"] == "a"


def test_the_export_names_the_policy_the_cluster_decided_by_last(tmp_path: Path) -> None:
    spec = validate_job_spec({"name": "x", "queue": "a", "runtime": "sim", "duration_seconds": 5})
    submitted = ev.JobSubmitted.new(stream="job-j1", job_id="j1", spec=spec, now=at(10), actor="t", correlation_id="j1")

    def policy(name: str) -> ev.PolicyInForce:
        return ev.PolicyInForce.new(stream="policy", actor="quota", correlation_id="policy", policy=name, now=at(0))

    assert export_inputs([submitted], tmp_path).policy == "corral"
    assert export_inputs([policy("las"), submitted, policy("fair-las")], tmp_path).policy == "fair-las"
