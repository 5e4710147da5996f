"""Placement reconciles the agents' heartbeats with the gangs it believes run.

After `kill -9` of the node-agents process the restarted agent heartbeats again (no NodeLost), but
without the jobs: unless placement reads `running_job_ids`, they stay RUNNING forever.
Here the decision
services run on real NATS and Postgres; the test is the node agent: it registers the node, reports
ranks, and publishes the heartbeats itself, listing the job or not.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from corral.client import Client
from corral.contracts import events as ev
from corral.contracts.envelope import Reason, job_stream, node_stream
from corral.contracts.lifecycle import LifecycleCode
from corral.contracts.queues import validate_queues
from corral.contracts.registry import encode
from corral.contracts.subjects import Subjects
from corral.projection import JobState
from corral.services.base import to_new_event
from tests.integration.test_services_flow import Running, register_nodes, report, spec
from tests.integration.test_services_flow import system as system

NODE = "node-0"


@pytest.fixture(autouse=True)
def _short_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_WORKERS_LOST_SECONDS", "2")
    monkeypatch.setenv("CORRAL_RELEASE_CONFIRM_SECONDS", "1")


class Agent:
    """Heartbeats of node node-0 every 0.25 s, listing `running`."""

    def __init__(self, client: Client, namespace: str) -> None:
        self.client, self.subject = client, Subjects(namespace).heartbeat(NODE)
        self.running: set[str] = set()
        self.sequence = 0
        self._beat = asyncio.Condition()

    async def beat_forever(self) -> None:
        while True:
            self.sequence += 1
            beat = ev.NodeHeartbeat.new(stream=node_stream(NODE), actor=f"node-agent/{NODE}", node=NODE,
                                        sequence=self.sequence, running_job_ids=sorted(self.running))
            await self.client.bus.nc.publish(self.subject, encode(beat))
            async with self._beat:
                self._beat.notify_all()
            await asyncio.sleep(0.25)

    async def beats(self, count: int, timeout: float = 30.0) -> None:
        """Wait until `count` more heartbeats (as they are now) have been sent."""
        until = self.sequence + count
        async with self._beat:
            await asyncio.wait_for(self._beat.wait_for(lambda: self.sequence >= until), timeout)


@pytest.fixture
async def agent(system: Running, namespace: str) -> AsyncIterator[Agent]:
    c = system.client
    await c.apply_queues(validate_queues({"queues": [{"name": "team-a", "guaranteed_gpus": 8}]}))
    await register_nodes(c, "1x8:H100")
    a = Agent(c, namespace)
    task = asyncio.create_task(a.beat_forever())
    await c.wait_for(lambda v: NODE in v.nodes and "team-a" in v.queues, 15)
    try:
        yield a
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def running(c: Client, agent: Agent, **fields: object) -> str:
    job = await c.submit(spec(gpus_per_replica=8, **fields))
    view = await c.wait_for(lambda v: job in v.jobs and v.jobs[job].state is JobState.STARTING, 15)
    agent.running.add(job)
    await report(c, job, view)
    await c.wait_for(lambda v: v.jobs[job].state is JobState.RUNNING, 15)
    return job


async def test_a_running_gang_its_agent_no_longer_runs_is_requeued_without_using_a_restart(
        system: Running, agent: Agent) -> None:
    c = system.client
    job = await running(c, agent, restart={"max_restarts": 0})
    await agent.beats(12)  # 3 s of heartbeats listing it, past the 2 s bound: nothing happens
    assert (await c.view()).jobs[job].state is JobState.RUNNING

    agent.running.discard(job)  # the agent was killed and came back without it
    view = await c.wait_for(lambda v: v.jobs[job].attempt == 1 and v.jobs[job].state is JobState.STARTING, 20)
    assert view.jobs[job].restarts == 0, "lost workers are not the job's fault: no restart is used"
    trail = [e for _, e in await c.job_events(job)]
    released = [e for e in trail if isinstance(e, ev.GangReleased)]
    requeued = [e for e in trail if isinstance(e, ev.JobRequeued)]
    assert [r.reason.code for r in released] == [LifecycleCode.WORKERS_LOST]
    assert "has not reported" in released[0].reason.message and "using no restart" in released[0].reason.message
    assert [(r.reason.code, r.attempt) for r in requeued] == [(LifecycleCode.WORKERS_LOST, 1)]
    freed = [e for _, e in await c.events(types=["GpusReleased"])]
    assert [(e.job_id, e.attempt, sorted(e.gpus)) for e in freed] == [(job, 0, list(range(8)))]


async def test_a_preemption_of_a_gang_with_no_process_does_not_wait_forever(
        system: Running, agent: Agent) -> None:
    c = system.client
    job = await running(c, agent)
    agent.running.discard(job)
    request = ev.PreemptRequested.new(
        stream=job_stream(job), actor="preemption", correlation_id=job, victim_job_id=job, for_job_id="urgent",
        deadline=datetime.now(UTC) + timedelta(seconds=600),
        reason=Reason(code="PREEMPTED_FOR_PRIORITY", message="urgent waits"))
    version = await c.store.stream_version(job_stream(job))
    await c.store.append(job_stream(job), version, [to_new_event(request)])  # as the preemption service does
    await c.wait_for(lambda v: v.jobs[job].state is JobState.PREEMPTING, 10)
    view = await c.wait_for(lambda v: v.jobs[job].attempt == 1 and not v.jobs[job].fences
                            and v.jobs[job].state in (JobState.PENDING, JobState.STARTING), 20)
    assert view.free_gpus() in (0, 8)  # placed again, or about to be
    released = [e for _, e in await c.job_events(job) if isinstance(e, ev.GangReleased)]
    assert [r.reason.code for r in released] == [LifecycleCode.WORKERS_LOST]


async def test_the_gpus_of_a_released_gang_stay_held_while_the_node_still_runs_it(
        system: Running, agent: Agent) -> None:
    c = system.client
    job = await running(c, agent)
    await c.cancel(job)
    view = await c.wait_for(lambda v: v.jobs[job].state is JobState.CANCELLED and not v.jobs[job].holding, 15)
    assert view.jobs[job].fences and view.free_gpus() == 0
    assert view.releasing_gpus() == {NODE: dict.fromkeys(range(8), job)}
    await agent.beats(8)  # 2 s of heartbeats still listing it (its processes are stopping): past the 1 s bound
    view = await c.view()
    assert view.free_gpus() == 0 and not [e for _, e in await c.events(types=["GpusReleased"])]
    agent.running.discard(job)  # every rank gone (here without WorkerExited: a report was lost)
    view = await c.wait_for(lambda v: v.free_gpus() == 8 and v.jobs[job].quota_gpus == 0, 10)
    assert not view.jobs[job].fences and not view.jobs[job].active


async def test_a_gpus_released_closes_the_allocation_rows_of_its_own_attempt_only(
        system: Running, postgres_dsn: str) -> None:
    """A fenced attempt 0 and a placed attempt 1 of one job can share a node: freeing attempt 0's
    GPUs must leave attempt 1's rows open (the unique index keeps guarding them)."""
    c = system.client
    stream = node_stream("node-9")

    def ledger(cls: type[ev.GpusAllocated] | type[ev.GpusReleased], attempt: int, gpus: list[int]) -> ev.Event:
        return cls.new(stream=stream, actor="placement", correlation_id="j", node="node-9", job_id="j",
                       gpus=gpus, attempt=attempt)

    await c.store.append(stream, 0, [to_new_event(ledger(ev.GpusAllocated, 0, [0, 1])),
                                     to_new_event(ledger(ev.GpusAllocated, 1, [2, 3])),
                                     to_new_event(ledger(ev.GpusReleased, 0, [0, 1]))])
    conn = await asyncpg.connect(postgres_dsn)
    try:
        rows = await conn.fetch("SELECT attempt, gpu, released_by IS NOT NULL AS closed FROM allocations "
                                "WHERE job_id = 'j' ORDER BY gpu")
    finally:
        await conn.close()
    assert [(r["attempt"], r["gpu"], r["closed"]) for r in rows] == [(0, 0, True), (0, 1, True), (1, 2, False),
                                                                     (1, 3, False)]
