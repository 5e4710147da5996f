"""The decision services together, in one event loop, on real NATS and Postgres.

Node agents are stood in for by publishing their reports on the inbox, exactly as agents do, so
these tests pin down the services' protocol; tests/e2e runs the real agents and processes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from corral.client import Client
from corral.contracts import events as ev
from corral.contracts.cluster import parse_cluster_shorthand
from corral.contracts.envelope import job_stream, node_stream
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.queues import validate_queues
from corral.contracts.registry import encode
from corral.contracts.subjects import Subjects
from corral.projection import ClusterView, JobState
from corral.services.admission.service import Admission
from corral.services.placement.service import Placement
from corral.services.preemption.service import Preemption
from corral.services.quota.service import Quota
from corral.services.run_loop import run_service
from corral.services.settings import Settings
from corral.stack.context import Context


@dataclass
class Running:
    client: Client
    stop: asyncio.Event
    tasks: list[asyncio.Task[None]]
    beats: list[asyncio.Task[None]] = field(default_factory=list)  # nodes' heartbeats (see register_nodes)


@pytest.fixture
async def system(nats_url: str, postgres_dsn: str, namespace: str) -> AsyncIterator[Running]:
    settings = Settings(nats_url=nats_url, postgres_dsn=postgres_dsn, namespace=namespace)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(run_service(cls, settings, stop=stop))
             for cls in (Admission, Quota, Placement, Preemption)]
    client = await Client.connect(Context(nats_url=nats_url, postgres_dsn=postgres_dsn, namespace=namespace))
    running = Running(client, stop, tasks)
    try:
        yield running
    finally:
        for beat in running.beats:
            beat.cancel()
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)
        await client.close()


async def register_nodes(client: Client, shorthand: str, beats: list[asyncio.Task[None]] | None = None) -> None:
    """Register the nodes as their agents do; with `beats`, also heartbeat for them (running
    nothing) as live agents do: placement frees a released gang's GPUs only on a node it has heard."""
    inventories = parse_cluster_shorthand(shorthand).inventories()
    for inv in inventories:
        await client.publish_request(ev.NodeRegistered.new(
            stream=node_stream(inv.node), actor=f"node-agent/{inv.node}", correlation_id=inv.node,
            node=inv.node, gpus=inv.gpus, nvlink_domains=inv.nvlink_domains, rack=inv.rack, zone=inv.zone))
    if beats is not None:
        beats.append(asyncio.create_task(_heartbeats(client, [inv.node for inv in inventories])))


async def _heartbeats(client: Client, nodes: list[str]) -> None:
    subjects = Subjects(client.bus.namespace)
    sequence = 0
    while True:
        sequence += 1
        for node in nodes:
            beat = ev.NodeHeartbeat.new(stream=node_stream(node), actor=f"node-agent/{node}", node=node,
                                        sequence=sequence)
            await client.bus.nc.publish(subjects.heartbeat(node), encode(beat))
        await asyncio.sleep(0.5)


async def report(client: Client, job_id: str, view: ClusterView, exit_code: int | None = None) -> None:
    """Act as the node agents: every rank of the job's current attempt started (or exited)."""
    job = view.jobs[job_id]
    for r in job.ranks:
        if exit_code is None:
            event: ev.Event = ev.WorkerStarted.new(stream=job_stream(job_id), actor=f"node-agent/{r.node}",
                                                   correlation_id=job_id, job_id=job_id, rank=r.rank, node=r.node,
                                                   pid=1000 + r.rank, attempt=job.attempt)
        else:
            event = ev.WorkerExited.new(stream=job_stream(job_id), actor=f"node-agent/{r.node}",
                                        correlation_id=job_id, job_id=job_id, rank=r.rank, node=r.node,
                                        exit_code=exit_code, attempt=job.attempt,
                                        reason=ev.Reason(code="COMPLETED", message="exit 0"))
        await client.publish_request(event)


def spec(**fields: object) -> object:
    return validate_job_spec({"name": "t", "queue": "team-a", "runtime": "sim", "duration_seconds": 60, **fields})


async def test_a_job_is_admitted_reserved_placed_run_and_completed(system: Running) -> None:
    c = system.client
    await c.apply_queues(validate_queues({"queues": [{"name": "team-a", "guaranteed_gpus": 16}]}))
    await register_nodes(c, "2x8:H100", system.beats)
    await c.wait_for(lambda v: len(v.nodes) == 2 and "team-a" in v.queues, 15)
    job_id = await c.submit(spec(replicas=2, gpus_per_replica=4))  # type: ignore[arg-type]
    view = await c.wait_for(lambda v: job_id in v.jobs and v.jobs[job_id].state is JobState.STARTING, 15)
    job = view.jobs[job_id]
    assert sum(len(r.gpus) for r in job.ranks) == 8
    assert len(job.nodes) == 1, "8 GPUs fit one 8-GPU node: the tightest placement wins"
    assert job.quota_gpus == 8, "placement places only what quota reserved (QuotaReserved comes first in the log)"
    await report(c, job_id, view)
    view = await c.wait_for(lambda v: v.jobs[job_id].state is JobState.RUNNING, 15)
    await report(c, job_id, view, exit_code=0)
    view = await c.wait_for(lambda v: v.jobs[job_id].state is JobState.COMPLETED, 15)
    assert view.free_gpus() == 16
    # quota gives the reservation back after the job ends (asynchronously): then nothing is held
    view = await c.wait_for(lambda v: v.jobs[job_id].quota_gpus == 0, 15)
    assert view.queue_usage() == {}, "a completed job holds no quota"
    assert job_id not in view.active, "a completed job with nothing held is no longer tracked as active"


async def test_a_gang_larger_than_free_gpus_waits_with_a_reason_and_holds_nothing(system: Running) -> None:
    c = system.client
    await c.apply_queues(validate_queues({"queues": [{"name": "team-a", "guaranteed_gpus": 32}]}))
    await register_nodes(c, "4x8:H100", system.beats)
    await c.wait_for(lambda v: len(v.nodes) == 4 and "team-a" in v.queues, 15)
    small = await c.submit(spec(replicas=1, gpus_per_replica=2))  # type: ignore[arg-type]
    await c.wait_for(lambda v: small in v.jobs and v.jobs[small].state is JobState.STARTING, 15)
    big = await c.submit(spec(replicas=4, gpus_per_replica=8))  # type: ignore[arg-type]
    view = await c.wait_for(lambda v: big in v.jobs and v.jobs[big].reason is not None
                            and v.jobs[big].reason.code == "GANG_DOES_NOT_FIT", 15)
    assert view.jobs[big].ranks == []
    assert all(job != big for n in view.nodes.values() for job in n.allocations.values())
    await c.cancel(small)
    view = await c.wait_for(lambda v: v.jobs[big].state is JobState.STARTING, 20)
    assert sorted(len(r.gpus) for r in view.jobs[big].ranks) == [8, 8, 8, 8]


async def test_a_submission_to_an_unknown_queue_is_rejected_naming_the_field(system: Running) -> None:
    c = system.client
    await c.apply_queues(validate_queues({"queues": [{"name": "team-a", "guaranteed_gpus": 8}]}))
    await register_nodes(c, "1x8:H100", system.beats)
    await c.wait_for(lambda v: len(v.nodes) == 1 and "team-a" in v.queues, 15)
    job_id = await c.submit(spec(queue="nope"))  # type: ignore[arg-type]
    view = await c.wait_for(lambda v: job_id in v.jobs and v.jobs[job_id].state is JobState.REJECTED, 15)
    assert view.jobs[job_id].reason is not None and view.jobs[job_id].reason.code == "QUEUE_UNKNOWN"
    rejected = [e for _, e in await c.job_events(job_id) if isinstance(e, ev.JobRejected)]
    assert rejected[0].problems[0].path == "queue"


async def test_a_hold_and_its_release_are_recorded_at_admissions_time_not_the_senders(system: Running) -> None:
    """The review: admission recorded a user's JobHeld / JobHoldReleased as sent, with the sender's
    event id and time, and a release's time starts the job's wait again: a release dated 2100
    kept the job from ever passing its queue's max_wait. The recorded event is admission's own."""
    c = system.client
    await c.apply_queues(validate_queues({"queues": [{"name": "team-a", "guaranteed_gpus": 8}]}))
    await register_nodes(c, "1x8:H100", system.beats)
    await c.wait_for(lambda v: len(v.nodes) == 1 and "team-a" in v.queues, 15)
    job_id = await c.submit(spec(gpus_per_replica=16))  # type: ignore[arg-type]  # never fits: waits
    await c.wait_for(lambda v: job_id in v.jobs and v.jobs[job_id].state is JobState.PENDING, 15)
    future = datetime(2100, 1, 1, tzinfo=UTC)
    for kind, state in ((ev.JobHeld, JobState.HELD), (ev.JobHoldReleased, JobState.PENDING)):
        sent = kind.new(stream=job_stream(job_id), actor="user/someone", correlation_id=job_id, job_id=job_id,
                        now=future, message="x" * 5000)
        await c.publish_request(sent)
        view = await c.wait_for(lambda v, s=state: v.jobs[job_id].state is s, 15)  # type: ignore[misc]
        recorded = [e for _, e in await c.job_events(job_id) if isinstance(e, kind)][-1]
        assert recorded.event_id != sent.event_id and recorded.causation_id == sent.event_id
        assert recorded.occurred_at < future and len(recorded.message) <= 1000
    assert view.jobs[job_id].waiting_since is not None and view.jobs[job_id].waiting_since < future


async def test_a_submission_is_dated_when_admission_receives_it(system: Running) -> None:
    """The review: a submission dated 1970 became the job's submit time, ahead of every job in
    FIFO and fair-share order (and past its queue's max_wait at once)."""
    c = system.client
    await c.apply_queues(validate_queues({"queues": [{"name": "team-a", "guaranteed_gpus": 8}]}))
    await register_nodes(c, "1x8:H100", system.beats)
    await c.wait_for(lambda v: len(v.nodes) == 1 and "team-a" in v.queues, 15)
    old = ev.JobSubmitted.new(stream=job_stream("jback"), actor="user/someone", job_id="jback",
                              spec=spec(), now=datetime(1970, 1, 2, tzinfo=UTC))  # type: ignore[arg-type]
    await c.publish_request(old)
    view = await c.wait_for(lambda v: "jback" in v.jobs and v.jobs["jback"].state is not JobState.PENDING, 15)
    assert view.jobs["jback"].submitted_at is not None
    assert abs((view.jobs["jback"].submitted_at - datetime.now(UTC)).total_seconds()) < 60


async def test_a_workers_report_is_dated_no_later_than_now_nor_before_its_attempt(system: Running) -> None:
    """The review: an agent's report was recorded with the time it wrote. A checkpoint dated an
    hour ahead made its job look cheap to preempt (no work lost), a start dated 1970 gave it days
    of attained service. Reports are kept within [the attempt's placement, now]."""
    c = system.client
    await c.apply_queues(validate_queues({"queues": [{"name": "team-a", "guaranteed_gpus": 8}]}))
    await register_nodes(c, "1x8:H100", system.beats)
    await c.wait_for(lambda v: len(v.nodes) == 1 and "team-a" in v.queues, 15)
    job_id = await c.submit(spec(gpus_per_replica=8))  # type: ignore[arg-type]
    view = await c.wait_for(lambda v: job_id in v.jobs and v.jobs[job_id].state is JobState.STARTING, 15)
    job = view.jobs[job_id]
    (rank,) = job.ranks
    await c.publish_request(ev.WorkerStarted.new(
        stream=job_stream(job_id), actor=f"node-agent/{rank.node}", correlation_id=job_id, job_id=job_id,
        rank=0, node=rank.node, pid=1000, attempt=job.attempt, now=datetime(1970, 1, 2, tzinfo=UTC)))
    view = await c.wait_for(lambda v: v.jobs[job_id].state is JobState.RUNNING, 15)
    assert view.jobs[job_id].running_since is not None and job.placed_at is not None
    assert view.jobs[job_id].running_since >= job.placed_at
    ahead = datetime.now(UTC) + timedelta(hours=1)
    await c.publish_request(ev.CheckpointDone.new(
        stream=job_stream(job_id), actor=f"node-agent/{rank.node}", correlation_id=job_id, job_id=job_id,
        path="/ckpt/step-9", rank=0, attempt=job.attempt, now=ahead))
    view = await c.wait_for(lambda v: v.jobs[job_id].checkpoint_at is not None, 15)
    assert view.jobs[job_id].checkpoint_at is not None
    assert view.jobs[job_id].checkpoint_at < ahead - timedelta(minutes=50)
