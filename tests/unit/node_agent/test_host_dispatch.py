"""A node-agents process hosting many nodes sends a job's stop or preemption to the agents of the
nodes its gang was started on, not to every agent it hosts (one process hosts every simulated
node: a release cost O(nodes) of the process's CPU per job)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from corral.contracts.envelope import Reason, job_stream
from corral.contracts.events import (
    GangReleased,
    GangReserved,
    JobCancelled,
    JobCompleted,
    JobRequeued,
    PreemptRequested,
    RankPlacement,
)
from corral.services.node_agent.service import AgentHost


class FakeReports:
    def __init__(self, calls: list[tuple[str, str]]) -> None:
        self.calls = calls

    def forget(self, job_id: str) -> None:
        self.calls.append(("forget", job_id))


class FakeAgent:
    def __init__(self, node: str) -> None:
        self.node = node
        self.calls: list[tuple[str, str]] = []
        self.over: list[tuple[str, int | None]] = []  # the attempts the log says are over
        self.reports = FakeReports(self.calls)

    async def on_gang_reserved(self, event: GangReserved, spec: Any, **_: Any) -> None:
        self.calls.append(("reserved", event.job_id))

    def on_stop(self, job_id: str, *, up_to_attempt: int | None, cause: Any) -> None:
        self.calls.append(("stop", job_id))

    def on_preempt(self, event: PreemptRequested) -> None:
        self.calls.append(("preempt", event.victim_job_id))

    def on_over(self, job_id: str, *, up_to_attempt: int | None) -> None:
        self.over.append((job_id, up_to_attempt))


def _host(nodes: int) -> tuple[AgentHost, dict[str, FakeAgent]]:
    agents = {f"n{i}": FakeAgent(f"n{i}") for i in range(nodes)}
    return AgentHost(bus=None, agents=list(agents.values()), publisher=None), agents  # type: ignore[arg-type]


def _reserved(job: str, nodes: list[str], attempt: int = 0) -> GangReserved:
    return GangReserved.new(stream=job_stream(job), actor="placement", job_id=job, attempt=attempt,
                            ranks=[RankPlacement(rank=i, node=n, gpus=[0]) for i, n in enumerate(nodes)],
                            world_size=len(nodes), master_addr="10.0.0.1", master_port=29500)


R = Reason(code="X", message="x")


def _called(agents: dict[str, FakeAgent]) -> dict[str, list[tuple[str, str]]]:
    return {node: agent.calls for node, agent in agents.items() if agent.calls}


def test_a_release_reaches_only_the_agents_of_the_gangs_nodes() -> None:
    host, agents = _host(50)
    asyncio.run(host._dispatch(_reserved("j1", ["n3", "n7"])))
    asyncio.run(host._dispatch(GangReleased.new(stream=job_stream("j1"), actor="placement", job_id="j1",
                                                attempt=0, reason=R)))
    assert _called(agents) == {"n3": [("reserved", "j1"), ("stop", "j1")],
                               "n7": [("reserved", "j1"), ("stop", "j1")]}


def test_every_stop_and_a_preemption_follow_each_attempts_nodes() -> None:
    host, agents = _host(20)
    asyncio.run(host._dispatch(_reserved("j1", ["n1"])))
    now = datetime.now(UTC)
    asyncio.run(host._dispatch(PreemptRequested.new(stream=job_stream("j1"), actor="preemption",
                                                    victim_job_id="j1", deadline=now + timedelta(seconds=30),
                                                    signal="SIGUSR1", reason=R)))
    asyncio.run(host._dispatch(JobRequeued.new(stream=job_stream("j1"), actor="preemption", job_id="j1",
                                               attempt=1, reason=R)))
    asyncio.run(host._dispatch(_reserved("j1", ["n2"], attempt=1)))
    asyncio.run(host._dispatch(JobCancelled.new(stream=job_stream("j1"), actor="admission", job_id="j1",
                                                reason=R)))
    assert _called(agents) == {
        "n1": [("reserved", "j1"), ("preempt", "j1"), ("stop", "j1"), ("forget", "j1"), ("stop", "j1")],
        "n2": [("reserved", "j1"), ("forget", "j1"), ("stop", "j1")]}


def test_a_job_this_process_did_not_start_is_stopped_on_every_agent() -> None:
    """An agent that runs a gang this process does not know of (forgotten for room) still stops it:
    each agent checks whether the job runs on it."""
    host, agents = _host(5)
    asyncio.run(host._dispatch(GangReleased.new(stream=job_stream("j9"), actor="placement", job_id="j9",
                                                attempt=0, reason=R)))
    assert _called(agents) == {f"n{i}": [("stop", "j9")] for i in range(5)}


def test_a_gang_adopted_at_start_is_stopped_on_its_node() -> None:
    host, agents = _host(5)
    host.started_on("j2", ["n4"])
    asyncio.run(host._dispatch(GangReleased.new(stream=job_stream("j2"), actor="placement", job_id="j2",
                                                attempt=0, reason=R)))
    assert _called(agents) == {"n4": [("stop", "j2")]}


def test_the_reservation_ledger_stops_growing_once_adoption_is_done() -> None:
    """The ledger is read once, when the agents adopt what survived a restart; folding every later
    reservation into it would grow the process without bound."""
    host, _ = _host(1)
    host.remember(_reserved("a", ["n0"]))
    assert host.ledger.verdict("a", 0, "n0").value == "keep"
    host.adoption_done()
    for i in range(100):
        host.remember(_reserved(f"j{i}", ["n0"]))
    assert host.ledger.verdict("a", 0, "n0").value == "unknown"
    assert host.ledger.verdict("j99", 0, "n0").value == "unknown"


def test_the_end_of_attempts_reaches_the_gangs_agents_with_the_attempts_over() -> None:
    """Their run folders go once reported (`Supervisor.attempts_over`)."""
    host, agents = _host(10)
    asyncio.run(host._dispatch(_reserved("j1", ["n2"])))
    asyncio.run(host._dispatch(GangReleased.new(stream=job_stream("j1"), actor="placement", job_id="j1",
                                                attempt=0, reason=R)))
    asyncio.run(host._dispatch(JobRequeued.new(stream=job_stream("j1"), actor="placement", job_id="j1",
                                               attempt=1, reason=R)))
    asyncio.run(host._dispatch(_reserved("j1", ["n2"], attempt=1)))
    asyncio.run(host._dispatch(JobCompleted.new(stream=job_stream("j1"), actor="placement", job_id="j1")))
    assert agents["n2"].over == [("j1", 0), ("j1", 0), ("j1", None)]
    assert all(not agent.over for node, agent in agents.items() if node != "n2")
