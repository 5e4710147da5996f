"""The decision services together, in one event loop, on real NATS and Postgres.

Node agents are stood in for by publishing their reports on the inbox, exactly as agents do, so
these tests pin down the services' protocol; tests/e2e runs the real agents and processes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

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
from corral.services.runtime import Settings, run_service
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
