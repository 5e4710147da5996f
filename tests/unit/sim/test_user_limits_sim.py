"""The simulator runs `max_gpus_per_user` as the services do: a user's jobs wait past the limit.

Its jobs carry their spec's user only when a queue sets the limit (the one rule that reads it), so
a trace without the limit schedules as if users did not exist (the recorded schedules' hashes
check that).
"""

from __future__ import annotations

import pytest

from corral.contracts.jobspec import validate_job_spec
from corral.core import Cluster, QueueConfig
from corral.sim.api import run_simulation
from corral.sim.workload import SimJob, Workload


def workload() -> Workload:
    jobs = []
    for i, user in enumerate(["alice", "alice", "alice", "bob"]):
        spec = validate_job_spec({"name": f"j{i}", "queue": "team", "user": user, "gpus_per_replica": 4,
                                  "runtime": "sim", "duration_seconds": 100})
        jobs.append(SimJob(id=f"j{i}", submit=float(i), duration=100.0, spec=spec))
    return Workload(tuple(jobs), source="test")


@pytest.mark.parametrize("pipeline", ["cycle", "services"])
def test_a_users_third_job_waits_for_one_of_their_first_two(pipeline: str) -> None:
    cluster = Cluster.uniform(2, 8, "H100")
    limited = run_simulation(workload(), cluster, queues=[QueueConfig("team", 16, max_gpus_per_user=8)],
                             pipeline=pipeline)
    start = {r.id: r.start for r in limited.records}
    assert start["j0"] == 0 and start["j1"] == 1 and start["j3"] == 3  # bob is not held to alice's limit
    assert start["j2"] is not None and start["j2"] >= 100  # alice's third waits for her first to end
    free = run_simulation(workload(), cluster, queues=[QueueConfig("team", 16)], pipeline=pipeline)
    assert {r.id: r.start for r in free.records}["j2"] == 2
