"""The pure parts of `corral.telemetry`: families from a folded view, the log's counters, the
endpoint's address, JSON log lines."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from corral.contracts import events as ev
from corral.contracts.cluster import parse_cluster_shorthand
from corral.contracts.envelope import Event, Reason, job_stream, node_stream
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.queues import QueueSpec
from corral.projection import Applied, ClusterView
from corral.summary import node_rows
from corral.telemetry import logs
from corral.telemetry.endpoint import parse_address, serve
from corral.telemetry.families import gpu_families, job_families, queue_families
from corral.telemetry.health import Phase, Readiness
from corral.telemetry.logstats import LogStatistics
from tests.metrics_text import Page, parse

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def job(cls: type[Event], job_id: str, seconds: float, **payload: Any) -> Event:
    return cls.new(stream=job_stream(job_id), actor="test", correlation_id=job_id, now=at(seconds), job_id=job_id,
                   **payload)


def cluster_with_a_preemption() -> tuple[ClusterView, Page]:
    """Two 8-GPU nodes (one lost later); job `jlow` (2x4 GPUs of team-a) runs from t=10, checkpoints
    at t=40, is preempted at t=50 and requeued; `jbig` waits, past team-a's max_wait (30 s) at t=63."""
    view, registry = ClusterView(), CollectorRegistry(auto_describe=False)
    stats = LogStatistics(registry)
    events: list[Event] = []
    for inv in parse_cluster_shorthand("2x8:H100").inventories():
        events.append(ev.NodeRegistered.new(stream=node_stream(inv.node), actor="agent", node=inv.node, gpus=inv.gpus,
                                            nvlink_domains=inv.nvlink_domains, rack=inv.rack, zone=inv.zone, now=T0))
    events.append(ev.QueueConfigured.new(stream="queue-team-a", actor="test", now=T0,
                                         queue=QueueSpec(name="team-a", guaranteed_gpus=8, max_gpus=16, max_wait=30.0)))
    spec = validate_job_spec({"name": "low", "queue": "team-a", "replicas": 2, "gpus_per_replica": 4,
                              "runtime": "sim", "duration_seconds": 600})
    big = validate_job_spec({"name": "big", "queue": "team-a", "replicas": 2, "gpus_per_replica": 8,
                             "runtime": "sim", "duration_seconds": 600})
    ranks = [ev.RankPlacement(rank=0, node="node-0", gpus=[0, 1, 2, 3]),
             ev.RankPlacement(rank=1, node="node-0", gpus=[4, 5, 6, 7])]
    preempt = Reason(code="PRIORITY", message="for jbig")
    events += [
        job(ev.JobSubmitted, "jlow", 0, spec=spec), job(ev.JobAdmitted, "jlow", 1, queue="team-a", priority=100,
                                                        replicas=2, gpus_per_replica=4),
        job(ev.QuotaReserved, "jlow", 2, queue="team-a", gpus=8),
        job(ev.GangReserved, "jlow", 4, ranks=ranks, world_size=2, master_addr="127.0.0.1", master_port=29500),
        job(ev.JobRunning, "jlow", 10),
        job(ev.JobSubmitted, "jbig", 20, spec=big), job(ev.JobAdmitted, "jbig", 21, queue="team-a", priority=900,
                                                        replicas=2, gpus_per_replica=8),
        job(ev.CheckpointDone, "jlow", 40, path="/ckpt/1", rank=0),
        ev.PreemptRequested.new(stream=job_stream("jlow"), actor="test", now=at(50), victim_job_id="jlow",
                                for_job_id="jbig", deadline=at(80), reason=preempt),
        job(ev.GangReleased, "jlow", 60, reason=Reason(code="PREEMPTED", message="stopped")),
        job(ev.JobRequeued, "jlow", 61, attempt=1, reason=Reason(code="PREEMPTED", message="requeued")),
        job(ev.PlacementPending, "jbig", 62, reason=Reason(code="GANG_DOES_NOT_FIT", message="16 > 8")),
        job(ev.WaitExceeded, "jbig", 63, queue="team-a", limit_queue="team-a", attempt=0, waiting_since=at(21),
            max_wait_seconds=30.0, waited_seconds=42.0, blocker=Reason(code="GANG_DOES_NOT_FIT", message="16 > 8")),
        ev.NodeLost.new(stream=node_stream("node-1"), actor="test", now=at(70), node="node-1",
                        reason=Reason(code="HEARTBEAT_MISSED", message="gone")),
    ]
    for e in events:
        if view.apply(e) is Applied.APPLIED:
            stats.observe(view, e)
    families: list[Metric] = [*gpu_families(view), *job_families(view), *queue_families(view)]

    class Fixed:
        def collect(self) -> list[Metric]:
            return families

    registry.register(Fixed())
    return view, parse(generate_latest(registry).decode())


def test_gauges_are_the_folded_view() -> None:
    _, page = cluster_with_a_preemption()
    gpus = page.by("corral_gpus", "node", "state")
    # jlow's gang is released but node-0 has not confirmed its ranks gone: its 8 GPUs are releasing
    assert gpus[("node-0", "releasing")] == 8 and gpus[("node-0", "free")] == 0
    assert gpus[("node-1", "lost")] == 8 and gpus[("node-1", "free")] == 0
    assert page.values("corral_gpus", node="node-0", model="H100", state="allocated") == [0.0]
    assert page.values("corral_gpu_allocation_ratio") == [1.0]  # 8 held of the 8 not lost
    assert page.by("corral_jobs", "queue", "state") == {("team-a", "PENDING"): 2.0}
    assert page.by("corral_pending_jobs", "reason") == {("PREEMPTED",): 1.0, ("GANG_DOES_NOT_FIT",): 1.0}
    assert page.values("corral_queue_guaranteed_gpus", queue="team-a") == [8.0]
    assert page.values("corral_queue_max_gpus", queue="team-a") == [16.0]
    assert page.values("corral_queue_fair_share_gpus", queue="team-a") == [8.0]  # all 8 usable GPUs
    # jbig escalated; jlow waits anew since its requeue (t=61), not past max_wait
    assert page.values("corral_jobs_wait_exceeded", queue="team-a") == [1.0]


def test_a_drained_node_s_free_gpus_are_draining_and_a_held_job_waits_for_reason_held() -> None:
    """`corral drain`: the unallocated GPUs of a draining node are `draining` (its allocated ones stay
    `allocated`), the node is `draining`; `corral hold`: the job is pending for reason HELD, and not
    in the queue's pending count (it waits for a release, not for GPUs)."""
    view = ClusterView()
    events: list[Event] = []
    for inv in parse_cluster_shorthand("2x8:H100").inventories():
        events.append(ev.NodeRegistered.new(stream=node_stream(inv.node), actor="agent", node=inv.node, gpus=inv.gpus,
                                            nvlink_domains=inv.nvlink_domains, rack=inv.rack, zone=inv.zone, now=T0))
    events.append(ev.QueueConfigured.new(stream="queue-team-a", actor="test", now=T0,
                                         queue=QueueSpec(name="team-a", guaranteed_gpus=8)))
    spec = validate_job_spec({"name": "one", "queue": "team-a", "replicas": 1, "gpus_per_replica": 2,
                              "runtime": "sim", "duration_seconds": 600})
    ranks = [ev.RankPlacement(rank=0, node="node-1", gpus=[0, 1])]
    events += [
        job(ev.JobSubmitted, "jrun", 0, spec=spec), job(ev.JobAdmitted, "jrun", 1, queue="team-a", priority=100,
                                                        replicas=1, gpus_per_replica=2),
        job(ev.QuotaReserved, "jrun", 2, queue="team-a", gpus=2),
        job(ev.GangReserved, "jrun", 3, ranks=ranks, world_size=1, master_addr="127.0.0.1", master_port=29500),
        ev.NodeDrained.new(stream=node_stream("node-1"), actor="test", now=at(5), node="node-1", user="admin"),
        job(ev.JobSubmitted, "jheld", 6, spec=spec), job(ev.JobAdmitted, "jheld", 7, queue="team-a", priority=100,
                                                         replicas=1, gpus_per_replica=2),
        job(ev.JobHeld, "jheld", 8, user="alice"),
    ]
    for e in events:
        assert view.apply(e) is Applied.APPLIED, e
    registry = CollectorRegistry(auto_describe=False)
    families: list[Metric] = [*gpu_families(view), *queue_families(view)]

    class Fixed:
        def collect(self) -> list[Metric]:
            return families

    registry.register(Fixed())
    page = parse(generate_latest(registry).decode())
    gpus = page.by("corral_gpus", "node", "state")
    assert (gpus[("node-1", "draining")], gpus[("node-1", "allocated")], gpus[("node-1", "free")]) == (6, 2, 0)
    assert (gpus[("node-0", "free")], gpus[("node-0", "draining")]) == (8, 0)
    assert page.by("corral_nodes", "state") == {("ready",): 1.0, ("draining",): 1.0, ("lost",): 0.0}
    assert page.by("corral_pending_jobs", "queue", "reason") == {("team-a", "HELD"): 1.0}
    assert page.values("corral_queue_pending_jobs", queue="team-a") == [0.0]
    rows = {r["node"]: r for r in node_rows(view)}  # what `corral nodes` prints
    assert rows["node-1"]["state"] == "draining" and rows["node-1"]["free"] == gpus[("node-1", "draining")]


def test_the_log_counters_and_waits() -> None:
    _, page = cluster_with_a_preemption()
    assert page.values("corral_quota_reservations_total", queue="team-a") == [1.0]
    assert page.values("corral_admission_attempts_total", result="admitted") == [2.0]
    assert page.values("corral_preemptions_total", queue="team-a", reason="PRIORITY") == [1.0]
    assert page.values("corral_job_requeues_total", queue="team-a", reason="PREEMPTED") == [1.0]
    # 8 GPUs x 20 s since the checkpoint at t=40, released at t=60
    assert page.values("corral_lost_gpu_seconds_total", queue="team-a", reason="PREEMPTED") == [160.0]
    assert page.values("corral_job_wait_to_quota_seconds_sum", queue="team-a") == [2.0]
    assert page.values("corral_job_wait_to_placement_seconds_sum", queue="team-a") == [4.0]
    assert page.values("corral_job_wait_to_running_seconds_sum", queue="team-a") == [10.0]
    assert page.values("corral_job_wait_to_running_seconds_bucket", queue="team-a", le="10.0") == [1.0]
    assert page.values("corral_job_wait_to_running_seconds_bucket", queue="team-a", le="5.0") == [0.0]


def test_a_repeated_preemption_request_of_the_same_attempt_counts_once() -> None:
    view, registry = ClusterView(), CollectorRegistry(auto_describe=False)
    stats = LogStatistics(registry)
    spec = validate_job_spec({"name": "x", "queue": "q", "replicas": 1, "gpus_per_replica": 1, "runtime": "sim",
                              "duration_seconds": 5})
    events = [job(ev.JobSubmitted, "jx", 0, spec=spec),
              job(ev.GangReserved, "jx", 1, ranks=[ev.RankPlacement(rank=0, node="n", gpus=[0])], world_size=1,
                  master_addr="127.0.0.1", master_port=29500)]
    for s in (2, 3):
        events.append(ev.PreemptRequested.new(stream=job_stream("jx"), actor="t", now=at(s), victim_job_id="jx",
                                              for_job_id="jy", deadline=at(30),
                                              reason=Reason(code="PRIORITY", message="m")))
    for e in events:
        view.apply(e)
        stats.observe(view, e)
    assert parse(generate_latest(registry).decode()).total("corral_preemptions_total") == 1.0


@pytest.mark.parametrize(("text", "expected"), [
    ("127.0.0.1:9464", ("127.0.0.1", 9464)), (":9464", ("0.0.0.0", 9464)), ("[::1]:0", ("::1", 0)),
    ("off", None), ("", None), (None, None)])
def test_metrics_addresses(text: str | None, expected: tuple[str, int] | None) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize("text", ["9464", "host:", "host:port", "h:70000"])
def test_a_bad_metrics_address_names_the_form(text: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_address(text)


def test_json_lines_carry_the_job_and_trace_ids() -> None:
    formatter = logs.JsonFormatter("placement")

    def line(message: str, *args: object, **extra: object) -> dict[str, Any]:
        record = logging.LogRecord("corral.placement", logging.INFO, __file__, 1, message, args, None)
        for k, v in extra.items():
            setattr(record, k, v)
        parsed: dict[str, Any] = json.loads(formatter.format(record))
        return parsed

    plain = line("node %s lost", "node-3")
    assert plain["job_id"] == "" and plain["trace_id"] == "" and plain["service"] == "placement"
    assert plain["message"] == "node node-3 lost" and plain["level"] == "INFO"
    assert line("job %s attempt %d released", "j01kbx2m3n4p5qr", 0)["job_id"] == "j01kbx2m3n4p5qr"
    assert line("anything", job_id="jgiven")["job_id"] == "jgiven"
    with logs.job_context("jcontext"):
        assert line("handling")["job_id"] == "jcontext"
    logs.set_trace_id_source(lambda: "ab" * 16)
    try:
        assert line("traced")["trace_id"] == "ab" * 16
    finally:
        logs.set_trace_id_source(logs._otel_trace_id)


def test_a_consumed_message_names_its_job_for_the_lines_logged_while_it_is_handled() -> None:
    """`logs.handling` (around every consumer's handler): a job's event by its stream header, an
    inbox request by its body's job_id; a batch about several jobs names none."""
    from corral.bus import Delivery

    def delivery(data: bytes, **headers: str) -> Delivery:
        return Delivery(subject="corral.x", data=data, headers=headers, delivery_count=1, stream="S",
                        stream_sequence=1, consumer_sequence=1, timestamp=None)

    event = delivery(b'{"type":"GangReserved"}', **{"Corral-Stream": "job-j01kbx2m3n4p5qr"})
    request = delivery(b'{"type":"JobSubmitted","event_id":"x","job_id": "train-7","spec":{"job_id":"no"}}')
    node = delivery(b'{"type":"NodeLost","node":"n1"}', **{"Corral-Stream": "node-n1"})
    assert [logs.job_of_message(m) for m in (event, request, node)] == ["j01kbx2m3n4p5qr", "train-7", None]
    record = logging.LogRecord("corral.x", logging.INFO, __file__, 1, "handling", (), None)
    with logs.handling([event]):
        assert logs.job_id_of(record) == "j01kbx2m3n4p5qr"
        with logs.handling([request, request]):
            assert logs.job_id_of(record) == "train-7"
        with logs.handling([event, request]):
            assert logs.job_id_of(record) == ""  # several jobs: none
    assert logs.job_id_of(record) == ""


async def _request(port: int, line: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"{line}\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    raw = (await reader.read()).decode()
    writer.close()
    head, _, body = raw.partition("\r\n\r\n")
    return int(head.split()[1]), body


async def test_the_endpoint_answers_its_paths_and_survives_a_failing_one() -> None:
    async def ok() -> tuple[int, str, bytes]:
        return 200, "text/plain", b"fine\n"

    async def broken() -> tuple[int, str, bytes]:
        raise RuntimeError("a collector bug")

    endpoint = await serve("127.0.0.1", 0, {"/metrics": ok, "/readyz": broken})
    try:
        assert await _request(endpoint.port, "GET /metrics HTTP/1.1") == (200, "fine\n")
        assert await _request(endpoint.port, "HEAD /metrics HTTP/1.1") == (200, "")
        assert (await _request(endpoint.port, "GET /readyz HTTP/1.1"))[0] == 500
        status, body = await _request(endpoint.port, "GET /nope HTTP/1.1")
        assert status == 404 and "/metrics" in body
        assert (await _request(endpoint.port, "POST /metrics HTTP/1.1"))[0] == 405
        assert await _request(endpoint.port, "GET /metrics?x=1 HTTP/1.1") == (200, "fine\n")
    finally:
        await endpoint.close()


class _Backlog:
    durable = "d"

    def __init__(self, pending: int) -> None:
        self.pending = pending

    async def backlog(self) -> tuple[int, int]:
        return self.pending, 0


async def test_ready_only_when_consuming_connected_and_caught_up() -> None:
    readiness = Readiness(connected=lambda: True, lease="placement", max_pending=100)
    assert (await readiness.report())[0] is False  # starting
    readiness.phase = Phase.REBUILDING
    ready, checks = await readiness.report()
    assert not ready and checks["lease"] == {"name": "placement", "held": True}
    readiness.phase, readiness.consumers = Phase.CONSUMING, [_Backlog(101)]
    assert (await readiness.report())[0] is False  # a backlog over the limit: not caught up
    readiness.consumers = [_Backlog(100)]
    assert (await readiness.report())[0] is True
    readiness.connected = lambda: False
    assert (await readiness.report())[0] is False
    readiness.phase = Phase.STOPPING
    assert (await readiness.healthz())[0] == 503
