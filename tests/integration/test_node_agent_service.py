"""The node-agent service against a real nats-server: registration, heartbeats, gangs across two
fake nodes, preemption with checkpoint and resume, the rank environment, stop and start failures.

Events are published as the outbox relay would publish them (each node's work first, through the
relay's own `NodeWorkRouter`, then the event itself); the agents' reports are read from the inbox
subjects with a plain NATS subscription.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest

from corral.bus import Bus
from corral.bus.bus import Outgoing
from corral.bus.node_work import NodeWorkRouter
from corral.bus.relay import event_headers
from corral.contracts.cluster import parse_cluster_shorthand
from corral.contracts.envelope import Event, Reason, job_stream
from corral.contracts.events import (
    CheckpointDone,
    GangReleased,
    GangReserved,
    JobCompleted,
    JobSubmitted,
    NodeHeartbeat,
    NodeLost,
    NodeRegistered,
    PreemptRequested,
    RankPlacement,
    WorkerExited,
    WorkerStarted,
)
from corral.contracts.jobspec import JobSpec
from corral.contracts.node_work import encode_assignment
from corral.contracts.registry import decode, encode
from corral.contracts.subjects import Subjects
from corral.eventstore import StoredEvent
from corral.services.node_agent.service import AgentHost, AgentOptions, durable_name, run_agents
from corral.worker import CHECKPOINTED_EXIT_CODE

PY = sys.executable
E = TypeVar("E", bound=Event)


@dataclass
class Seen:
    """Every decoded message on the inbox and heartbeat subjects of the test's namespace."""

    events: list[Event] = field(default_factory=list)

    def of(self, cls: type[E], job_id: str | None = None) -> list[E]:
        return [e for e in self.events if isinstance(e, cls)
                and (job_id is None or getattr(e, "job_id", None) == job_id)]


async def wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    async def loop() -> None:
        while not condition():
            await asyncio.sleep(0.02)
    await asyncio.wait_for(loop(), timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MemoryLog:
    """The part of `EventStore` the relay's router reads: a log kept in memory."""

    def __init__(self) -> None:
        self.events: list[StoredEvent] = []

    def append(self, event: Event, version: int) -> StoredEvent:
        stored = StoredEvent(event_id=event.event_id, stream=event.stream, type=event.type,
                             schema_version=event.schema_version, data=encode(event),
                             correlation_id=event.correlation_id, causation_id=event.causation_id,
                             occurred_at=event.occurred_at, version=version, position=len(self.events) + 1,
                             recorded_at=event.occurred_at)
        self.events.append(stored)
        return stored

    async def read_stream(self, stream: str, from_version: int = 1) -> list[StoredEvent]:
        return [e for e in self.events if e.stream == stream and e.version >= from_version]


@dataclass
class Cluster:
    bus: Bus
    seen: Seen
    options: AgentOptions
    host: AgentHost | None = None
    version: int = 0
    log: MemoryLog = field(default_factory=MemoryLog)
    router: NodeWorkRouter | None = None

    async def publish(self, event: Event) -> None:
        """As the outbox relay does: each node's work (`corral.bus.node_work`), then
        `<ns>.events.<Type>`; msg id = event id, the relay's headers (stream version, position)."""
        self.version += 1
        if self.router is None:
            self.router = NodeWorkRouter(self.log, Subjects(self.bus.namespace), event_headers)  # type: ignore[arg-type]
        stored = self.log.append(event, self.version)
        copies = await self.router.work(stored, self.bus.max_message_bytes)
        await self.bus.publish_many([*copies, Outgoing(f"{self.bus.namespace}.events.{event.type}", stored.data,
                                                       event.event_id, event_headers(stored))])


async def _subscribe(bus: Bus, seen: Seen) -> None:
    async def record(msg: Any) -> None:
        seen.events.append(decode(msg.data))

    ns = bus.namespace
    await bus.nc.subscribe(f"{ns}.inbox.>", cb=record)
    await bus.nc.subscribe(f"{ns}.heartbeat.*", cb=record)
    await bus.nc.flush()


@pytest.fixture
async def cluster(nats_url: str, namespace: str, tmp_path: Path, request: pytest.FixtureRequest
                  ) -> AsyncIterator[Cluster]:
    """Two fake nodes (node-0, node-1; 4 GPUs each) in one agent process; consuming node work, or
    (`indirect` parameter "broadcast") every job's events."""
    bus = await Bus.connect(nats_url, namespace)
    await bus.ensure_streams()
    seen = Seen()
    await _subscribe(bus, seen)
    options = AgentOptions(work_dir=tmp_path / "nodes", heartbeat_seconds=0.2, stop_grace_seconds=3.0,
                           stop_workers_on_exit=True, spec_wait_seconds=2.0,
                           work_subjects=getattr(request, "param", "node"))
    c = Cluster(bus, seen, options)
    ready = asyncio.Event()

    def on_ready(host: AgentHost) -> None:
        c.host = host
        ready.set()

    stop = asyncio.Event()
    inventories = parse_cluster_shorthand("2x4:H100").inventories()
    task = asyncio.create_task(run_agents(nats_url, namespace, inventories, options, stop, on_ready=on_ready))
    await asyncio.wait_for(ready.wait(), 15)
    try:
        yield c
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await bus.close()


def submitted(job_id: str, **spec: Any) -> JobSubmitted:
    fields: dict[str, Any] = {"name": job_id, "queue": "team-a", "runtime": "sim", **spec}
    return JobSubmitted.new(stream=job_stream(job_id), actor="admission", job_id=job_id, spec=JobSpec(**fields))


def reserved(job_id: str, placement: list[tuple[int, str, list[int]]], attempt: int = 0,
             resume_from: str | None = None) -> GangReserved:
    return GangReserved.new(stream=job_stream(job_id), actor="placement", correlation_id=job_id, job_id=job_id,
                            ranks=[RankPlacement(rank=r, node=n, gpus=g) for r, n, g in placement],
                            world_size=len(placement), master_addr="127.0.0.1", master_port=free_port(),
                            attempt=attempt, resume_from=resume_from)


FOUR_RANKS = [(0, "node-0", [0]), (1, "node-0", [1]), (2, "node-1", [0]), (3, "node-1", [1])]


async def test_each_node_registers_its_inventory_and_heartbeats(cluster: Cluster) -> None:
    seen = cluster.seen
    await wait_for(lambda: len(seen.of(NodeRegistered)) == 2
                   and {h.node for h in seen.of(NodeHeartbeat)} == {"node-0", "node-1"})
    registered = {e.node: e for e in seen.of(NodeRegistered)}
    assert set(registered) == {"node-0", "node-1"}
    node0 = registered["node-0"]
    assert [(g.index, g.model, g.memory_gib) for g in node0.gpus] == [(i, "H100", 80.0) for i in range(4)]
    assert node0.nvlink_domains == [[0, 1, 2, 3]] and node0.rack == "rack-0" and node0.zone == "zone-0"
    assert node0.stream == "node-node-0" and node0.actor == "node-agent/node-0"
    assert node0.correlation_id == "node-0"
    beats = [h for h in seen.of(NodeHeartbeat) if h.node == "node-0"]
    await wait_for(lambda: len([h for h in seen.of(NodeHeartbeat) if h.node == "node-0"]) >= 3)
    beats = [h for h in seen.of(NodeHeartbeat) if h.node == "node-0"]
    assert [h.sequence for h in beats] == sorted(h.sequence for h in beats)


async def test_gang_across_two_nodes_starts_every_rank_once_and_reports_completion(cluster: Cluster) -> None:
    seen = cluster.seen
    await cluster.publish(submitted("job-a", replicas=4, duration_seconds=1.0))
    gang = reserved("job-a", FOUR_RANKS)
    await cluster.publish(gang)
    await wait_for(lambda: len(seen.of(WorkerStarted, "job-a")) == 4)
    started = seen.of(WorkerStarted, "job-a")
    assert sorted((e.rank, e.node) for e in started) == [(0, "node-0"), (1, "node-0"), (2, "node-1"),
                                                          (3, "node-1")]
    assert all(e.attempt == 0 and e.stream == "job-job-a" and e.correlation_id == "job-a"
               and e.causation_id == gang.event_id for e in started)
    assert {e.actor for e in started} == {"node-agent/node-0", "node-agent/node-1"}
    # A redelivered reservation (same event, new message) must not start anything twice.
    await cluster.bus.publish(f"{cluster.bus.namespace}.events.GangReserved", encode(gang), "redelivery-1")
    await wait_for(lambda: len(seen.of(WorkerExited, "job-a")) == 4)
    exited = seen.of(WorkerExited, "job-a")
    assert sorted(e.rank for e in exited) == [0, 1, 2, 3]
    assert all(e.exit_code == 0 and e.reason.code == "COMPLETED" for e in exited)
    await cluster.bus.publish(f"{cluster.bus.namespace}.events.GangReserved", encode(gang), "redelivery-2")
    await cluster.publish(submitted("job-marker", duration_seconds=0.1))  # consumed after the redeliveries
    await cluster.publish(reserved("job-marker", [(0, "node-1", [3])]))
    await wait_for(lambda: len(seen.of(WorkerExited, "job-marker")) == 1)
    assert len(seen.of(WorkerStarted, "job-a")) == 4


async def test_a_completed_attempts_run_folders_go_once_reported(cluster: Cluster) -> None:
    seen = cluster.seen
    await cluster.publish(submitted("job-gone", replicas=4, duration_seconds=0.2))
    gang = reserved("job-gone", FOUR_RANKS)
    await cluster.publish(gang)
    await wait_for(lambda: len(seen.of(WorkerExited, "job-gone")) == 4)
    folders = [cluster.options.work_dir / node / "run" / "job-gone.attempt-0" for node in ("node-0", "node-1")]
    await wait_for(lambda: not any(f.exists() for f in folders))
    # a reservation delivered again is still known as launched here: nothing starts
    await cluster.bus.publish(f"{cluster.bus.namespace}.events.GangReserved", encode(gang), "redelivery-gone")
    await cluster.publish(submitted("job-marker2", duration_seconds=0.1))
    await cluster.publish(reserved("job-marker2", [(0, "node-1", [3])]))
    await wait_for(lambda: len(seen.of(WorkerExited, "job-marker2")) == 1)
    assert len(seen.of(WorkerStarted, "job-gone")) == 4 and not any(f.exists() for f in folders)


async def test_preempted_gang_checkpoints_stops_and_resumes_from_its_step(cluster: Cluster) -> None:
    seen = cluster.seen
    await cluster.publish(submitted("job-p", replicas=4, duration_seconds=120.0))
    await cluster.publish(reserved("job-p", FOUR_RANKS))
    await wait_for(lambda: len(seen.of(WorkerStarted, "job-p")) == 4)
    log0 = cluster.options.logs / "job-p" / "rank-0.log"
    await wait_for(lambda: log0.exists() and "step=5\n" in log0.read_text())
    # every rank has installed its checkpoint-signal handler (a rank still starting dies of SIGUSR1)
    logs = [cluster.options.logs / "job-p" / f"rank-{r}.log" for r in range(4)]
    await wait_for(lambda: all(p.exists() and "step=1\n" in p.read_text() for p in logs))
    preempt = PreemptRequested.new(stream=job_stream("job-p"), actor="preemption", correlation_id="job-p",
                                   victim_job_id="job-p", for_job_id="job-urgent",
                                   deadline=datetime.now(UTC) + timedelta(seconds=20),
                                   reason=Reason(code="PREEMPTED_FOR_PRIORITY", message="job-urgent waits"))
    await cluster.publish(preempt)
    await wait_for(lambda: len(seen.of(CheckpointDone, "job-p")) == 1 and len(seen.of(WorkerExited, "job-p")) == 4)
    done = seen.of(CheckpointDone, "job-p")[0]
    assert done.rank == 0 and done.attempt == 0 and done.step is not None and done.step >= 5
    assert done.causation_id == preempt.event_id
    assert json.loads(Path(done.path).read_text()) == {"step": done.step}
    assert Path(done.path).parent == cluster.options.checkpoints / "job-p"
    exited = seen.of(WorkerExited, "job-p")
    assert all(e.exit_code == CHECKPOINTED_EXIT_CODE and e.reason.code == "CHECKPOINTED" for e in exited)

    # Requeued and placed again (on other GPUs): every rank resumes from the checkpointed step.
    await cluster.publish(reserved("job-p", [(0, "node-1", [2]), (1, "node-1", [3]), (2, "node-0", [2]),
                                             (3, "node-0", [3])], attempt=1, resume_from=done.path))
    await wait_for(lambda: len([e for e in seen.of(WorkerStarted, "job-p") if e.attempt == 1]) == 4)
    await wait_for(lambda: f"attempt=1 start step={done.step} " in log0.read_text())


async def test_process_rank_gets_the_torch_distributed_environment(cluster: Cluster, tmp_path: Path) -> None:
    dump = tmp_path / "dump.py"
    dump.write_text(textwrap.dedent("""
        import json, os
        out = os.path.join(os.environ["CORRAL_CHECKPOINT_DIR"], "env-" + os.environ["RANK"] + ".json")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        json.dump(dict(os.environ), open(out, "w"))
    """))
    seen = cluster.seen
    await cluster.publish(submitted("job-env", runtime="process", replicas=3, command=[PY, str(dump)],
                                    env={"LR": "0.5"}))
    gang = reserved("job-env", [(0, "node-1", [2, 3]), (1, "node-0", [0, 1]), (2, "node-1", [0, 1])],
                    attempt=2, resume_from="/ckpt/step-7.pt")
    await cluster.publish(gang)
    await wait_for(lambda: len(seen.of(WorkerExited, "job-env")) == 3)
    assert all(e.exit_code == 0 for e in seen.of(WorkerExited, "job-env"))
    ckpt = cluster.options.checkpoints / "job-env"
    envs = {r: json.loads((ckpt / f"env-{r}.json").read_text()) for r in range(3)}
    wanted = {  # rank: CUDA_VISIBLE_DEVICES, LOCAL_RANK, NODE_RANK (node-1 holds rank 0: NODE_RANK 0)
        0: ("2,3", "0", "0"), 1: ("0,1", "0", "1"), 2: ("0,1", "1", "0")}
    for rank, (gpus, local, node_rank) in wanted.items():
        env = envs[rank]
        assert (env["CUDA_VISIBLE_DEVICES"], env["LOCAL_RANK"], env["NODE_RANK"]) == (gpus, local, node_rank)
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "3"
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == str(gang.master_port)
        assert env["CORRAL_JOB_ID"] == "job-env" and env["CORRAL_CHECKPOINT_DIR"] == str(ckpt)
        assert env["CORRAL_RESUME_FROM"] == "/ckpt/step-7.pt" and env["CORRAL_ATTEMPT"] == "2"
        assert env["LR"] == "0.5" and env["CORRAL_CHECKPOINT_SIGNAL"] == "SIGUSR1"
    assert envs[0]["LOCAL_WORLD_SIZE"] == "2" and envs[1]["LOCAL_WORLD_SIZE"] == "1"
    assert all(e.attempt == 2 for e in seen.of(WorkerStarted, "job-env"))


async def test_released_gang_is_stopped_and_reported_with_the_signal(cluster: Cluster) -> None:
    seen = cluster.seen
    await cluster.publish(submitted("job-r", replicas=2, duration_seconds=120.0))
    await cluster.publish(reserved("job-r", [(0, "node-0", [3]), (1, "node-1", [3])]))
    await wait_for(lambda: len(seen.of(WorkerStarted, "job-r")) == 2)
    await cluster.publish(GangReleased.new(stream=job_stream("job-r"), actor="placement", correlation_id="job-r",
                                           job_id="job-r", reason=Reason(code="START_TIMEOUT", message="x")))
    await wait_for(lambda: len(seen.of(WorkerExited, "job-r")) == 2)
    for e in seen.of(WorkerExited, "job-r"):
        assert e.reason.code == "STOPPED" and e.exit_code is None
        assert e.reason.details == {"signal": "SIGTERM"}
    await wait_for(lambda: all("job-r" not in h.running_job_ids for h in seen.of(NodeHeartbeat)[-2:]))
    # released while running: its folders go once its stops are reported
    await wait_for(lambda: not any((cluster.options.work_dir / node / "run" / "job-r.attempt-0").exists()
                                   for node in ("node-0", "node-1")))


async def test_an_event_out_of_the_logs_order_starts_nothing(cluster: Cluster) -> None:
    """The agent acts only in the log's order: a reservation replayed after its release (a new
    message with the old stream version) and one not published by the relay (no stream version)
    start nothing."""
    seen = cluster.seen
    await cluster.publish(submitted("job-o", replicas=1, duration_seconds=120.0))
    gang = reserved("job-o", [(0, "node-0", [2])])
    await cluster.publish(gang)
    reserved_version = cluster.version
    await wait_for(lambda: len(seen.of(WorkerStarted, "job-o")) == 1)
    await cluster.publish(GangReleased.new(stream=job_stream("job-o"), actor="placement", correlation_id="job-o",
                                           job_id="job-o", reason=Reason(code="START_TIMEOUT", message="x")))
    await wait_for(lambda: len(seen.of(WorkerExited, "job-o")) == 1)
    subjects = Subjects(cluster.bus.namespace)
    await cluster.bus.publish(subjects.node_work("node-0", "NodeAssignment"),
                              encode_assignment(encode(gang), None, None), "replay-1",
                              headers={"Corral-Stream-Version": str(reserved_version)})
    forged_spec = submitted("job-forged", duration_seconds=60.0)
    await cluster.publish(forged_spec)
    forged = reserved("job-forged", [(0, "node-1", [2])])
    # as a service credential could, past the log
    await cluster.bus.publish(subjects.node_work("node-1", "NodeAssignment"),
                              encode_assignment(encode(forged), encode(forged_spec), None), "unrelayed-1")
    await cluster.publish(submitted("job-marker2", duration_seconds=0.1))  # consumed after them
    await cluster.publish(reserved("job-marker2", [(0, "node-0", [3])]))
    await wait_for(lambda: len(seen.of(WorkerExited, "job-marker2")) == 1)
    assert len(seen.of(WorkerStarted, "job-o")) == 1
    assert seen.of(WorkerStarted, "job-forged") == []


async def test_node_marked_lost_while_alive_registers_again(cluster: Cluster) -> None:
    seen = cluster.seen
    await wait_for(lambda: len(seen.of(NodeRegistered)) == 2)
    await cluster.publish(NodeLost.new(stream="node-node-1", actor="placement", correlation_id="node-1",
                                       node="node-1", reason=Reason(code="HEARTBEAT_MISSED", message="x")))
    await wait_for(lambda: [e.node for e in seen.of(NodeRegistered)].count("node-1") == 2)
    assert [e.node for e in seen.of(NodeRegistered)].count("node-0") == 1


@pytest.mark.parametrize("cluster", ["broadcast"], indirect=True)
async def test_reservation_delivered_before_its_jobs_submission_waits_for_it(cluster: Cluster) -> None:
    """After a NATS server failover the durable may redeliver a job's JobSubmitted (its first
    delivery lost with the old leader) after the job's GangReserved, with an older stream version
    (the job must not fail with "never saw this job's JobSubmitted"). The reservation
    waits for the submission; the submission, knowledge and not an action, is taken in any order."""
    seen = cluster.seen
    submission = submitted("job-late", duration_seconds=0.2)
    cluster.version = 1  # the submission is version 1 of the job's stream; the reservation 7
    later = reserved("job-late", [(0, "node-0", [0])])
    cluster.version = 6
    await cluster.publish(later)
    await asyncio.sleep(0.3)
    assert seen.of(WorkerExited, "job-late") == []  # not failed: waiting for the spec
    await cluster.bus.publish(f"{cluster.bus.namespace}.events.JobSubmitted", encode(submission),
                              submission.event_id, headers={"Corral-Stream-Version": "1"})
    await wait_for(lambda: [e.exit_code for e in seen.of(WorkerExited, "job-late")] == [0])
    assert len(seen.of(WorkerStarted, "job-late")) == 1


async def test_reservation_of_an_unknown_job_reports_every_local_rank_as_not_started(cluster: Cluster) -> None:
    """A job whose submission never comes within `spec_wait_seconds`: every local rank is
    reported not started (placement then fails or restarts the gang)."""
    seen = cluster.seen
    await cluster.publish(reserved("job-ghost", [(0, "node-0", [0]), (1, "node-0", [1])]))
    await wait_for(lambda: len(seen.of(WorkerExited, "job-ghost")) == 2)
    for e in seen.of(WorkerExited, "job-ghost"):
        assert e.exit_code is None and e.reason.code == "START_FAILED" and "JobSubmitted" in e.reason.message
    assert seen.of(WorkerStarted, "job-ghost") == []


async def test_agent_on_broadcast_subjects_started_after_the_submission_knows_the_spec_from_the_stream(
        nats_url: str, namespace: str, tmp_path: Path) -> None:
    bus = await Bus.connect(nats_url, namespace)
    await bus.ensure_streams()
    seen = Seen()
    await _subscribe(bus, seen)
    early = Cluster(bus, seen, AgentOptions(work_dir=tmp_path / "nodes", stop_workers_on_exit=True,
                                            work_subjects="broadcast"))
    await early.publish(submitted("job-early", duration_seconds=0.2))
    await early.publish(submitted("job-over", duration_seconds=0.2))
    await early.publish(JobCompleted.new(stream=job_stream("job-over"), actor="placement", job_id="job-over"))
    ready = asyncio.Event()
    hosts: list[AgentHost] = []
    stop = asyncio.Event()
    inventories = parse_cluster_shorthand("1x2:A100").inventories()

    def on_ready(host: AgentHost) -> None:
        hosts.append(host)
        ready.set()

    task = asyncio.create_task(run_agents(nats_url, namespace, inventories, early.options, stop,
                                          on_ready=on_ready))
    try:
        await asyncio.wait_for(ready.wait(), 15)
        assert set(hosts[0].specs) == {"job-early"}  # an ended job's spec is not kept
        await early.publish(reserved("job-early", [(0, "node-0", [0])]))
        await wait_for(lambda: [e.exit_code for e in seen.of(WorkerExited, "job-early")] == [0])
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await bus.close()


def test_durable_name_is_stable_per_node_set() -> None:
    assert durable_name(["gpu.1"]) == "node-agent-gpu_1"
    assert durable_name(["b", "a"]) == durable_name(["a", "b"]) != durable_name(["a", "c"])
    assert durable_name(["a", "b"]).startswith("node-agents-")


async def test_service_process_with_stop_workers_on_exit_stops_its_workers_on_sigterm(
        nats_url: str, namespace: str, tmp_path: Path) -> None:
    bus = await Bus.connect(nats_url, namespace)
    await bus.ensure_streams()
    seen = Seen()
    await _subscribe(bus, seen)
    shorthand = tmp_path / "cluster.shorthand"
    shorthand.write_text("1x2:H100\n")
    env = {**os.environ, "CORRAL_NATS_URL": nats_url, "CORRAL_NAMESPACE": namespace,
           "CORRAL_LOG_DIR": str(tmp_path / "logs")}
    proc = await asyncio.create_subprocess_exec(
        PY, "-m", "corral.services.node_agent", "--inventory", str(shorthand), "--runtime", "sim",
        "--state-dir", str(tmp_path / "nodes"), "--heartbeat-seconds", "0.3", "--stop-grace", "3",
        "--stop-workers-on-exit", "--run-as", "agent", "--advertise-address", "none", "--port-range", "auto",
        "--metrics-address", "off", env=env)
    try:
        await wait_for(lambda: len(seen.of(NodeRegistered)) == 1)
        c = Cluster(bus, seen, AgentOptions(work_dir=tmp_path))
        # A `process` job under --runtime sim is simulated: its command never runs.
        await c.publish(submitted("job-sig", runtime="process", command=["/nonexistent"],
                                  estimated_runtime_seconds=120.0))
        await c.publish(reserved("job-sig", [(0, "node-0", [0])]))
        await wait_for(lambda: len(seen.of(WorkerStarted, "job-sig")) == 1)
        assert (tmp_path / "logs" / "workers" / "job-sig" / "rank-0.log").exists()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
        await wait_for(lambda: len(seen.of(WorkerExited, "job-sig")) == 1)
        assert seen.of(WorkerExited, "job-sig")[0].reason.code == "STOPPED"
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await bus.close()


def test_nvml_inventory_without_nvml_exits_2_with_a_clear_error(tmp_path: Path) -> None:
    from corral.services.node_agent.host.inventory import NvmlUnavailable, discover
    if not isinstance(discover("probe"), NvmlUnavailable):
        pytest.skip("this machine has NVML")
    import subprocess
    done = subprocess.run([PY, "-m", "corral.services.node_agent", "--node", "gpu-1", "--inventory", "nvml",
                           "--state-dir", str(tmp_path)], env={**os.environ, "CORRAL_NATS_URL": "nats://127.0.0.1:1"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--inventory nvml" in done.stderr and "--inventory FILE" in done.stderr
    assert "Traceback" not in done.stderr
