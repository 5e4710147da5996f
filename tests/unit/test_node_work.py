"""Node-scoped work: which agents the relay sends an event to, and the NodeAssignment contract."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from corral.bus.node_work import NodeWorkRouter
from corral.bus.relay import event_headers
from corral.contracts.envelope import Event, Reason, job_stream, queue_stream
from corral.contracts.events import (
    GangReleased,
    GangReserved,
    JobCancelled,
    JobCompleted,
    JobRequeued,
    JobSubmitted,
    NodeLost,
    PreemptRequested,
    QueueConfigured,
    RankPlacement,
)
from corral.contracts.jobspec import JobSpec
from corral.contracts.node_work import decode_assignment, encode_assignment
from corral.contracts.problems import ContractError
from corral.contracts.queues import QueueSpec
from corral.contracts.registry import encode
from corral.contracts.subjects import Subjects
from corral.eventstore import StoredEvent


class Log:
    def __init__(self) -> None:
        self.events: list[StoredEvent] = []
        self.versions: dict[str, int] = {}

    def add(self, event: Event) -> StoredEvent:
        version = self.versions[event.stream] = self.versions.get(event.stream, 0) + 1
        stored = StoredEvent(event_id=event.event_id, stream=event.stream, type=event.type,
                             schema_version=event.schema_version, data=encode(event), correlation_id=None,
                             causation_id=None, occurred_at=event.occurred_at, version=version,
                             position=len(self.events) + 1, recorded_at=event.occurred_at)
        self.events.append(stored)
        return stored

    async def read_stream(self, stream: str, from_version: int = 1) -> list[StoredEvent]:
        return [e for e in self.events if e.stream == stream]


def submitted(job: str, queue: str = "team-a") -> JobSubmitted:
    return JobSubmitted.new(stream=job_stream(job), actor="admission", job_id=job,
                            spec=JobSpec(name=job, queue=queue, runtime="sim", replicas=2, duration_seconds=60))


def reserved(job: str, nodes: list[str], attempt: int = 0) -> GangReserved:
    return GangReserved.new(stream=job_stream(job), actor="placement", job_id=job, attempt=attempt,
                            ranks=[RankPlacement(rank=i, node=n, gpus=[0]) for i, n in enumerate(nodes)],
                            world_size=len(nodes), master_addr="10.0.0.1", master_port=29500)


def released(job: str, attempt: int = 0, code: str = "WORKER_FAILED") -> GangReleased:
    return GangReleased.new(stream=job_stream(job), actor="placement", job_id=job, attempt=attempt,
                            reason=Reason(code=code, message="done"))


def route(router: NodeWorkRouter, log: Log, event: Event) -> list[tuple[str, str]]:
    copies = asyncio.run(router.work(log.add(event)))
    return [(c.subject, c.msg_id.rpartition("@")[2]) for c in copies]


def test_a_job_is_sent_to_the_nodes_it_touches_only() -> None:
    log = Log()
    router = NodeWorkRouter(log, Subjects("c"), event_headers)  # type: ignore[arg-type]
    assert route(router, log, QueueConfigured.new(stream=queue_stream("team-a"), actor="admin",
                                                  queue=QueueSpec(name="team-a", allow_root=True))) == []
    assert route(router, log, submitted("j1")) == []
    assert route(router, log, reserved("j1", ["n1", "n1", "n2"])) == [
        ("c.events.node.n1.NodeAssignment", "n1"), ("c.events.node.n2.NodeAssignment", "n2")]
    preempt = PreemptRequested.new(stream=job_stream("j1"), actor="preemption", victim_job_id="j1",
                                   deadline=datetime.now(UTC) + timedelta(seconds=30),
                                   reason=Reason(code="PREEMPTED", message="x"))
    assert [s for s, _ in route(router, log, preempt)] == ["c.events.node.n1.PreemptRequested",
                                                            "c.events.node.n2.PreemptRequested"]
    assert len(route(router, log, released("j1"))) == 2
    # a gang that completed (every rank exited 0) has nothing left to stop on its nodes
    assert route(router, log, released("j1", code="COMPLETED")) == []
    requeued = JobRequeued.new(stream=job_stream("j1"), actor="placement", job_id="j1", attempt=1,
                               reason=Reason(code="PREEMPTED", message="x"))
    assert len(route(router, log, requeued)) == 2
    # the second attempt elsewhere: its stops reach the old nodes and the new one
    assert [n for _, n in route(router, log, reserved("j1", ["n3"], attempt=1))] == ["n3"]
    cancel = JobCancelled.new(stream=job_stream("j1"), actor="admission", job_id="j1",
                              reason=Reason(code="CANCELLED", message="x"))
    assert [n for _, n in route(router, log, cancel)] == ["n1", "n2", "n3"]
    assert route(router, log, JobCompleted.new(stream=job_stream("j1"), actor="placement", job_id="j1")) == []
    lost = NodeLost.new(stream="node-n7", actor="placement", node="n7", reason=Reason(code="LOST", message="x"))
    assert route(router, log, lost) == [("c.events.node.n7.NodeLost", "n7")]
    assert router.sent == {"NodeAssignment": 3, "PreemptRequested": 2, "GangReleased": 2, "JobRequeued": 2,
                           "JobCancelled": 3, "NodeLost": 1}


def test_the_assignment_carries_the_spec_and_queue_and_the_events_headers() -> None:
    log = Log()
    router = NodeWorkRouter(log, Subjects("c"), event_headers)  # type: ignore[arg-type]
    queue = QueueConfigured.new(stream=queue_stream("team-a"), actor="admin",
                                queue=QueueSpec(name="team-a", allow_root=True))
    for event in (queue, submitted("j1"), submitted("j2", queue="other")):
        route(router, log, event)
    gang = log.add(reserved("j1", ["n1"]))
    [copy] = asyncio.run(router.work(gang))
    assert copy.headers is not None and copy.headers["Corral-Stream-Version"] == "2"
    assert copy.headers["Corral-Position"] == str(gang.position) and copy.msg_id == f"{gang.event_id}@n1"
    got = decode_assignment(copy.data)
    assert got.reservation.job_id == "j1" and got.submission is not None and got.submission.spec.replicas == 2
    assert got.queue is not None and got.queue.queue.allow_root
    [other] = asyncio.run(router.work(log.add(reserved("j2", ["n1"]))))
    assert decode_assignment(other.data).queue is None


def test_a_relay_started_mid_log_reads_what_it_does_not_hold_from_the_store() -> None:
    log = Log()
    for event in (QueueConfigured.new(stream=queue_stream("team-a"), actor="admin", queue=QueueSpec(name="team-a")),
                  submitted("j1"), reserved("j1", ["n1", "n2"])):
        log.add(event)
    router = NodeWorkRouter(log, Subjects("c"), event_headers)  # type: ignore[arg-type]
    assert [n for _, n in route(router, log, released("j1"))] == ["n1", "n2"]
    [copy, _] = asyncio.run(router.work(log.add(reserved("j1", ["n1", "n4"], attempt=1))))
    got = decode_assignment(copy.data)
    assert got.submission is not None and got.queue is not None and got.reservation.attempt == 1


def test_an_assignment_newer_than_the_agent_or_broken_is_a_contract_error_naming_the_field() -> None:
    gang = encode(reserved("j1", ["n1"]))
    doc = msgspec.json.decode(encode_assignment(gang, None, None))
    with pytest.raises(ContractError, match="newer than this agent knows") as newer:
        decode_assignment(msgspec.json.encode({**doc, "schema_version": 2}))
    assert newer.value.field == "schema_version"
    with pytest.raises(ContractError, match="submission"):
        decode_assignment(encode_assignment(gang, encode(submitted("other")), None))
    with pytest.raises(ContractError, match="reservation"):
        decode_assignment(encode_assignment(encode(submitted("j1")), None, None))
    with pytest.raises(ContractError):
        decode_assignment(b"[1, 2]")


def test_an_embedded_event_of_an_older_schema_version_is_upcast() -> None:
    """The log keeps every version: an assignment embeds a JobSubmitted as stored (here v1,
    whose upcaster the registry holds) and the agent decodes it as the current version."""
    current = msgspec.json.decode(encode(submitted("j1")))
    old = {**current, "schema_version": 1}
    got = decode_assignment(encode_assignment(encode(reserved("j1", ["n1"])), msgspec.json.encode(old), None))
    assert got.submission is not None and got.submission.schema_version == 2


def test_a_submission_forgotten_for_room_is_read_from_the_store() -> None:
    log = Log()
    router = NodeWorkRouter(log, Subjects("c"), event_headers)  # type: ignore[arg-type]
    for i in range(2_001):
        route(router, log, submitted(f"j{i}"))
    [copy] = asyncio.run(router.work(log.add(reserved("j0", ["n1"]))))
    got = decode_assignment(copy.data)
    assert got.submission is not None and got.submission.job_id == "j0"


def test_every_event_an_agent_is_declared_to_act_on_reaches_it_as_node_work() -> None:
    """An event type given the node agent as a consumer (`corral.contracts.flow`) must be routed by
    the relay too (`JOB_WORK`, `NODE_EVENTS`, or carried in the assignment), or agents on their
    node's subjects never see it."""
    from corral.contracts import events as ev
    from corral.contracts import flow as fl
    from corral.contracts import routes as rt
    from corral.contracts.node_work import JOB_WORK, NODE_EVENTS

    carried = {ev.JobSubmitted, ev.QueueConfigured, ev.GangReserved}
    ended = {ev.JobCompleted, ev.JobFailed, ev.JobRejected}  # a placed job's release comes before its end
    assert set(rt.consumed_by(fl.NODE_AGENT)) <= carried | ended | set(JOB_WORK) | set(NODE_EVENTS)
