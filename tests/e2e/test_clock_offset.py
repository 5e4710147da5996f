"""A node whose clock is minutes off loses nothing: what it could break is measured by the clock
of the one deciding, never by the node's.

Two node agents, each a process of its own under libfaketime (`bench/clock_faults.py`): node-0's
clock 5 minutes ahead, node-1's 5 minutes behind, every process they fork (stepds, ranks) too.
A preloaded library, not an offset option of the agent: it moves every clock the agent's code
and its children read (Python's, the C library's), so no read of the node's clock is missed.
Every gang has a rank on each node. Their jobs run and complete; a time limit ends its job at
the limit by placement's clock; the heartbeats keep both nodes alive; a preempted gang gets its
whole grace (checkpoints and exits CHECKPOINTED on both nodes, neither killed at once nor left
to overrun).

Skipped with the reason where libfaketime cannot be used (`make test-deps` installs it as root).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.client import Client
from corral.contracts import events as ev
from corral.contracts.jobspec import JobSpec, validate_job_spec
from corral.contracts.lifecycle import LifecycleCode
from corral.projection import JobState
from corral.stack.up import Agents, ManagedProcess, Stack
from corral.worker import CHECKPOINTED_EXIT_CODE
from tests.e2e.conftest import StackFactory, connect, dump_logs, with_queues

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import clock_faults

_WHY_NOT = clock_faults.why_not()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")

OFFSETS = {"node-0": +300.0, "node-1": -300.0}


def gang(name: str, seconds: float, **extra: object) -> JobSpec:
    return validate_job_spec({"name": name, "queue": "team-a", "replicas": 2, "gpus_per_replica": 4,
                              "runtime": "sim", "duration_seconds": seconds, **extra})


@pytest.fixture
def offset_agents(make_stack: StackFactory, tmp_path: Path) -> Iterator[tuple[Stack, list[ManagedProcess]]]:
    """The control plane (no agents of its own) and one agent process per node, each with its clock off."""
    stack = make_stack(cluster=None, agents=Agents.NONE, env={"CORRAL_RELEASE_CONFIRM_SECONDS": "2"})
    assert stack.context is not None and stack.context.log_dir
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"nodes": [{"name": n, "gpus": 4, "model": "H100"} for n in OFFSETS]}))
    base = {**os.environ, "CORRAL_NATS_URL": stack.context.nats_url, "CORRAL_NAMESPACE": stack.context.namespace,
            "CORRAL_LOG_DIR": stack.context.log_dir, "CORRAL_LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1",
            "CORRAL_AGENT_RUN_AS": "agent", "CORRAL_AGENT_STOP_WORKERS_ON_EXIT": "1"}
    base.pop("CORRAL_POSTGRES_DSN", None)
    agents = [ManagedProcess(
        f"agent-{node}",
        [sys.executable, "-m", "corral.services.node_agent", "--inventory", str(cluster), "--node", node,
         "--runtime", "sim", "--state-dir", str(tmp_path / "nodes"), "--advertise-address", "none",
         "--port-range", "auto", "--metrics-address", "off"],
        {**base, **clock_faults.env(offset)}, Path(stack.context.log_dir) / f"agent-{node}.log")
        for node, offset in OFFSETS.items()]
    for a in agents:
        a.start()
    try:
        yield stack, agents
    finally:
        for a in agents:
            a.stop()


def trail(events: list[tuple[object, ev.Event]]) -> list[ev.Event]:
    return [e for _, e in events]


async def test_nodes_minutes_off_run_their_jobs_to_time_limits_and_preemption_graces_by_the_deciders_clock(
        offset_agents: tuple[Stack, list[ManagedProcess]]) -> None:
    stack, agents = offset_agents
    c: Client = await connect(stack)
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 8}], nodes=2, timeout=60)
        for a in agents:  # the agents' own clocks are off: their log lines say so
            assert a.alive(), dump_logs(stack)

        # 1. jobs run and complete on both nodes
        done = await c.submit(gang("done", 1.0))
        view = await c.wait_for(lambda v: v.jobs.get(done) is not None and v.jobs[done].state.terminal, 60)
        assert view.jobs[done].state is JobState.COMPLETED, view.jobs[done]
        assert sorted(view.jobs[done].nodes) == ["node-0", "node-1"]

        # 2. a time limit of 3 s on a job that would run 60 s: failed after 3 s of placement's clock
        slow = await c.submit(gang("slow", 60.0, time_limit="3s"))
        view = await c.wait_for(lambda v: v.jobs.get(slow) is not None and v.jobs[slow].state.terminal
                                and v.free_gpus() == 8, 60)
        reason = view.jobs[slow].reason
        assert view.jobs[slow].state is JobState.FAILED and reason is not None, view.jobs[slow]
        assert reason.code == LifecycleCode.TIME_LIMIT, reason
        events = trail(await c.job_events(slow))
        running = next(e for e in events if isinstance(e, ev.JobRunning)).occurred_at
        failed = next(e for e in events if isinstance(e, ev.JobFailed)).occurred_at
        assert 3.0 <= (failed - running).total_seconds() < 8.0, (running, failed)

        # 3. a preempted gang gets its grace on both nodes: it checkpoints and exits CHECKPOINTED
        low = await c.submit(gang("low", 6.0, priority="low", checkpoint={"grace_seconds": 20}))
        log = Path(stack.context.log_dir) / "workers" / low / "rank-0.log"  # type: ignore[union-attr]
        await c.wait_for(lambda v: v.jobs.get(low) is not None and v.jobs[low].state is JobState.RUNNING
                         and log.exists()
                         and "step=3" in log.read_text(), 60)
        urgent = await c.submit(gang("urgent", 1.0, priority="urgent", preemptible=False))
        view = await c.wait_for(lambda v: v.jobs.get(urgent) is not None and v.jobs[urgent].state.terminal, 90)
        assert view.jobs[urgent].state is JobState.COMPLETED, view.jobs[urgent]
        events = trail(await c.job_events(low))
        asked = next(e for e in events if isinstance(e, ev.PreemptRequested))
        exits = [e for e in events if isinstance(e, ev.WorkerExited) and e.attempt == 0]
        assert sorted(e.node for e in exits) == ["node-0", "node-1"], exits
        assert all(e.exit_code == CHECKPOINTED_EXIT_CODE for e in exits), exits  # none killed at once
        released = next(e for e in events if isinstance(e, ev.GangReleased))
        assert (released.occurred_at - asked.occurred_at).total_seconds() < 20.0, (asked, released)  # no overrun
        requeued = next(e for e in events if isinstance(e, ev.JobRequeued))
        checkpoints = [e for e in events if isinstance(e, ev.CheckpointDone)]
        assert checkpoints and requeued.resume_from == checkpoints[0].path, (checkpoints, requeued)
        view = await c.wait_for(lambda v: v.jobs[low].state.terminal, 90)
        assert view.jobs[low].state is JobState.COMPLETED, view.jobs[low]

        # 4. the heartbeats kept both nodes alive all along
        for node in OFFSETS:
            lost = [e for e in await c.store.read_stream(f"node-{node}") if e.type == "NodeLost"]
            assert not lost, (node, lost)
            assert not view.nodes[node].lost
    except BaseException:
        print(dump_logs(stack))
        for a in agents:
            print(a.log_path.read_text(errors="replace")[-4000:])
        raise
    finally:
        await c.close()
