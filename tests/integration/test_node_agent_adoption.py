"""Workers outlive their agent: a `kill -9` or a graceful stop of the agent, then a new agent adopts.

After `kill -9` of the node agents, the workers keep running; the restarted agent must know them
and report their exits, or they are orphans. These run
real agents (in-process or as `python -m corral.services.node_agent`), real stepds and sim workers
against a real nats-server; the agents' reports are read from the inbox subjects.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from corral.bus import Bus
from corral.bus.bus import Outgoing
from corral.bus.naming import EVENTS
from corral.contracts.cluster import parse_cluster_shorthand
from corral.contracts.envelope import Reason, job_stream
from corral.contracts.events import (
    CheckpointDone,
    GangReleased,
    NodeHeartbeat,
    NodeRegistered,
    PreemptRequested,
    WorkerExited,
    WorkerStarted,
)
from corral.services.node_agent.process.step_files import read_state
from corral.services.node_agent.service import AgentHost, AgentOptions, durable_name, run_agents
from corral.worker import CHECKPOINTED_EXIT_CODE
from tests.integration.test_node_agent_service import Cluster, Seen, _subscribe, reserved, submitted, wait_for
from tests.processes import alive

PY = sys.executable


def kill_leftovers(work_dir: Path) -> None:
    """Whatever a failed test left running: every stepd and rank group under `work_dir`."""
    for state_file in work_dir.glob("*/run/*.attempt-*/state.json"):
        state = read_state(state_file.parent) or {}
        for rec in (state.get("ranks") or {}).values():
            if rec.get("pid") and rec.get("exited_at") is None:
                with contextlib.suppress(OSError):
                    os.killpg(rec["pid"], signal.SIGKILL)
        if state.get("stepd_pid") and state.get("phase") != "ended":
            with contextlib.suppress(OSError):
                os.kill(state["stepd_pid"], signal.SIGKILL)


class Agents:
    """One in-process node-agent host for `1x2:H100` (node-0), started and stopped at will."""

    def __init__(self, nats_url: str, namespace: str, options: AgentOptions) -> None:
        self.nats_url, self.namespace, self.options = nats_url, namespace, options
        self.stop_event = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.host: AgentHost | None = None

    async def start(self) -> AgentHost:
        ready = asyncio.Event()

        def on_ready(host: AgentHost) -> None:
            self.host = host
            ready.set()

        self.stop_event = asyncio.Event()
        inventories = parse_cluster_shorthand("1x2:H100").inventories()
        self.task = asyncio.create_task(run_agents(self.nats_url, self.namespace, inventories, self.options,
                                                   self.stop_event, on_ready=on_ready))
        await asyncio.wait_for(ready.wait(), 30)
        assert self.host is not None
        return self.host

    async def stop(self) -> None:
        self.stop_event.set()
        if self.task is not None:
            await asyncio.wait_for(self.task, 30)
            self.task = None


@pytest.fixture
async def env(nats_url: str, namespace: str, tmp_path: Path) -> AsyncIterator[tuple[Cluster, Agents]]:
    bus = await Bus.connect(nats_url, namespace)
    await bus.ensure_streams()
    seen = Seen()
    await _subscribe(bus, seen)
    options = AgentOptions(work_dir=tmp_path / "nodes", runtime="sim", heartbeat_seconds=0.2, stop_grace_seconds=3.0,
                           kill_grace_seconds=2.0)
    agents = Agents(nats_url, namespace, options)
    try:
        yield Cluster(bus, seen, options), agents
    finally:
        with contextlib.suppress(Exception):
            await agents.stop()
        kill_leftovers(options.work_dir)
        await bus.close()


def beats_after(seen: Seen, count: int) -> list[NodeHeartbeat]:
    return seen.of(NodeHeartbeat)[count:]


async def test_exit_while_the_agent_was_killed_is_reported_by_the_restarted_agent(
        nats_url: str, namespace: str, tmp_path: Path) -> None:
    bus = await Bus.connect(nats_url, namespace)
    await bus.ensure_streams()
    seen = Seen()
    await _subscribe(bus, seen)
    shorthand = tmp_path / "cluster.shorthand"
    shorthand.write_text("1x2:H100\n")
    work = tmp_path / "nodes"
    env = {**os.environ, "CORRAL_NATS_URL": nats_url, "CORRAL_NAMESPACE": namespace}
    argv = [PY, "-m", "corral.services.node_agent", "--inventory", str(shorthand), "--runtime", "sim",
            "--state-dir", str(work), "--heartbeat-seconds", "0.2", "--run-as", "agent",
            "--advertise-address", "none", "--port-range", "auto", "--metrics-address", "off"]
    agent = await asyncio.create_subprocess_exec(*argv, env=env)
    again: asyncio.subprocess.Process | None = None
    try:
        await wait_for(lambda: len(seen.of(NodeRegistered)) == 1)
        c = Cluster(bus, seen, AgentOptions(work_dir=work))
        # Long enough to outlive the agent's kill however late its start is reported (on a
        # loaded machine seconds pass between the rank's start and the test hearing of it).
        await c.publish(submitted("job-k", duration_seconds=8.0))
        await c.publish(reserved("job-k", [(0, "node-0", [0])]))
        await wait_for(lambda: len(seen.of(WorkerStarted, "job-k")) == 1)
        pid = seen.of(WorkerStarted, "job-k")[0].pid
        agent.kill()  # kill -9 of the agent process, not of its process group
        await agent.wait()
        assert alive(pid), "the worker outlives its agent"
        await wait_for(lambda: not alive(pid), 30)  # the rank ends while no agent runs
        assert seen.of(WorkerExited, "job-k") == []
        beats = len(seen.of(NodeHeartbeat))

        again = await asyncio.create_subprocess_exec(*argv, env=env)
        await wait_for(lambda: len(seen.of(WorkerExited, "job-k")) >= 1)
        [exited] = {e.event_id: e for e in seen.of(WorkerExited, "job-k")}.values()
        assert exited.exit_code == 0 and exited.reason.code == "COMPLETED" and exited.attempt == 0
        # The restarted agent reports the start again; the same event id makes it one report.
        started = seen.of(WorkerStarted, "job-k")
        assert len(started) == 2 and started[0].event_id == started[1].event_id
        # Once its exit is reported, the job is never listed as running here again. (Until then
        # it may be: its last output is shipped before its exit is reported, see `log_shipper`.)
        beats = len(seen.of(NodeHeartbeat))
        await wait_for(lambda: len(beats_after(seen, beats)) >= 3)
        assert all("job-k" not in h.running_job_ids for h in beats_after(seen, beats))
    finally:
        for proc in (agent, again):
            if proc is not None and proc.returncode is None:
                proc.kill()
                await proc.wait()
        kill_leftovers(work)
        await bus.close()


async def test_a_graceful_stop_leaves_the_worker_running_and_the_next_agent_adopts_and_preempts_it(
        env: tuple[Cluster, Agents]) -> None:
    c, agents = env
    seen = c.seen
    await agents.start()
    await c.publish(submitted("job-g", replicas=2, duration_seconds=120.0))
    gang = reserved("job-g", [(0, "node-0", [0]), (1, "node-0", [1])])
    await c.publish(gang)
    await wait_for(lambda: len(seen.of(WorkerStarted, "job-g")) == 2)
    pids = [e.pid for e in seen.of(WorkerStarted, "job-g")]
    logs = [c.options.logs / "job-g" / f"rank-{r}.log" for r in range(2)]
    await wait_for(lambda: all(p.exists() and "step=1\n" in p.read_text() for p in logs))

    await agents.stop()  # SIGTERM of the agent: an upgrade
    assert all(alive(pid) for pid in pids) and seen.of(WorkerExited, "job-g") == []
    beats = len(seen.of(NodeHeartbeat))

    await agents.start()
    await wait_for(lambda: any("job-g" in h.running_job_ids for h in beats_after(seen, beats)))
    assert all(alive(pid) for pid in pids)
    preempt = PreemptRequested.new(stream=job_stream("job-g"), actor="preemption", correlation_id="job-g",
                                   victim_job_id="job-g", for_job_id="job-urgent",
                                   deadline=datetime.now(UTC) + timedelta(seconds=20),
                                   reason=Reason(code="PREEMPTED_FOR_PRIORITY", message="job-urgent waits"))
    await c.publish(preempt)
    await wait_for(lambda: len(seen.of(CheckpointDone, "job-g")) == 1
                   and len({e.rank for e in seen.of(WorkerExited, "job-g")}) == 2)
    done = seen.of(CheckpointDone, "job-g")[0]
    assert done.causation_id == preempt.event_id and done.attempt == 0
    assert all(e.exit_code == CHECKPOINTED_EXIT_CODE and e.reason.code == "CHECKPOINTED"
               for e in seen.of(WorkerExited, "job-g"))
    assert len({e.event_id for e in seen.of(WorkerStarted, "job-g")}) == 2  # re-reports keep their ids
    beats = len(seen.of(NodeHeartbeat))
    await wait_for(lambda: len(beats_after(seen, beats)) >= 2)
    assert all("job-g" not in h.running_job_ids for h in beats_after(seen, beats))


async def test_an_adopted_gang_the_log_released_is_killed_before_the_node_registers(
        env: tuple[Cluster, Agents]) -> None:
    c, agents = env
    seen = c.seen
    await agents.start()
    await c.publish(submitted("job-x", duration_seconds=120.0))
    await c.publish(reserved("job-x", [(0, "node-0", [1])]))
    await wait_for(lambda: len(seen.of(WorkerStarted, "job-x")) == 1)
    pid = seen.of(WorkerStarted, "job-x")[0].pid
    await agents.stop()
    assert alive(pid)

    # While no agent runs, placement releases the gang (e.g. the node looked lost) and the agents'
    # durable consumer is gone (expired): only the log can tell the next agent.
    await c.publish(GangReleased.new(stream=job_stream("job-x"), actor="placement", correlation_id="job-x",
                                     job_id="job-x", attempt=0,
                                     reason=Reason(code="NODE_LOST", message="node node-0 was lost")))
    await c.bus.js.delete_consumer(c.bus.names.stream(EVENTS), durable_name(["node-0"]))
    registered = len(seen.of(NodeRegistered))

    await agents.start()
    await wait_for(lambda: len(seen.of(WorkerExited, "job-x")) == 1 and len(seen.of(NodeRegistered)) > registered)
    assert not alive(pid)
    [exited] = seen.of(WorkerExited, "job-x")
    assert exited.reason.code == "STOPPED" and exited.reason.details == {"signal": "SIGTERM"}
    # killed (and reported) before the node offered its GPUs again
    order = [e for e in seen.events if isinstance(e, WorkerExited | NodeRegistered)]
    assert order.index(exited) < order.index(seen.of(NodeRegistered)[registered])
    beats = len(seen.of(NodeHeartbeat))
    await wait_for(lambda: len(beats_after(seen, beats)) >= 2)
    assert all("job-x" not in h.running_job_ids for h in beats_after(seen, beats))


async def test_an_agent_upgraded_from_broadcast_to_node_subjects_keeps_its_running_job_to_the_end(
        env: tuple[Cluster, Agents]) -> None:
    """The agent upgrade path (docs/operations.md): a job started by an agent consuming every job's
    events (`work_subjects="broadcast"`) keeps running when the agent restarts on its node's
    subjects with the same durable (its filter updated), and completes; the restarted agent then
    stops on a node-scoped GangReleased and starts new work from a NodeAssignment."""
    c, agents = env
    seen = c.seen
    agents.options = dataclasses.replace(c.options, work_subjects="broadcast")
    await agents.start()
    await c.publish(submitted("job-up", duration_seconds=4.0))
    await c.publish(reserved("job-up", [(0, "node-0", [0])]))
    await wait_for(lambda: len(seen.of(WorkerStarted, "job-up")) == 1)
    [started] = seen.of(WorkerStarted, "job-up")
    await agents.stop()  # the upgrade: SIGTERM of the old agent, workers left running
    assert alive(started.pid) and seen.of(WorkerExited, "job-up") == []

    agents.options = dataclasses.replace(c.options, work_subjects="node")
    host = await agents.start()
    consumer = await c.bus.js.consumer_info(c.bus.names.stream(EVENTS), durable_name(["node-0"]))
    assert consumer.config.filter_subject == f"{c.bus.namespace}.events.node.node-0.>"
    assert alive(started.pid)
    await wait_for(lambda: [e.exit_code for e in seen.of(WorkerExited, "job-up")] == [0], timeout=30)
    assert len({e.event_id for e in seen.of(WorkerStarted, "job-up")}) == 1  # adopted, never started twice
    await c.publish(GangReleased.new(stream=job_stream("job-up"), actor="placement", correlation_id="job-up",
                                     job_id="job-up", attempt=0, reason=Reason(code="COMPLETED", message="done")))
    await c.publish(submitted("job-after", duration_seconds=0.2))
    await c.publish(reserved("job-after", [(0, "node-0", [1])]))
    await wait_for(lambda: [e.exit_code for e in seen.of(WorkerExited, "job-after")] == [0])
    assert "job-after" in host.specs


async def test_a_completed_attempt_delivered_again_after_a_restart_is_not_launched_again(
        env: tuple[Cluster, Agents]) -> None:
    """A short job runs to its end here (reported, its run folder removed); the agent stops, and
    its reservation is delivered again to the next agent (a copy past the durable's ack floor, as
    when the ack was lost): the restarted agent knows the attempt as launched here and starts nothing."""
    c, agents = env
    seen = c.seen
    await agents.start()
    await c.publish(submitted("job-r", duration_seconds=0.2))
    gang = reserved("job-r", [(0, "node-0", [0])])
    c.version += 1
    assert c.router is not None
    copies = await c.router.work(c.log.append(gang, c.version), c.bus.max_message_bytes)
    await c.bus.publish_many(copies)
    await wait_for(lambda: [e.exit_code for e in seen.of(WorkerExited, "job-r")] == [0])
    folder = c.options.work_dir / "node-0" / "run" / "job-r.attempt-0"
    await wait_for(lambda: not folder.exists())
    await agents.stop()

    await c.bus.publish_many([Outgoing(o.subject, o.data, f"{o.msg_id}-again", o.headers) for o in copies])
    host = await agents.start()
    await wait_for(lambda: job_stream("job-r") in host._versions)  # the copy is handled
    await asyncio.sleep(0.5)
    assert not folder.exists()
    assert len(seen.of(WorkerStarted, "job-r")) == 1, "launched again"
