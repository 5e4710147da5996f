"""Small logs for the command tests: the events, in order, that a cluster's history recorded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from corral.contracts import events as ev
from corral.contracts.cluster import parse_cluster_shorthand
from corral.contracts.envelope import Event, Reason, job_stream, node_stream, queue_stream
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.queues import validate_queues

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def job_event(job_id: str, cls: type[Event], seconds: float, **payload: Any) -> Event:
    return cls.new(stream=job_stream(job_id), actor="t", correlation_id=job_id, job_id=job_id, now=at(seconds),
                   **payload)


def nodes(shape: str) -> list[Event]:
    return [ev.NodeRegistered.new(stream=node_stream(inv.node), actor="agent", node=inv.node, gpus=inv.gpus,
                                  nvlink_domains=inv.nvlink_domains, rack=inv.rack, zone=inv.zone, now=T0)
            for inv in parse_cluster_shorthand(shape).inventories()]


def queues() -> list[Event]:
    tree = validate_queues({"queues": [{"name": "q", "guaranteed_gpus": 16}]}).queues
    return [ev.QueueConfigured.new(stream=queue_stream(q.name), actor="t", queue=q, now=T0) for q in tree]


def submitted(job_id: str, seconds: float, gpus: int = 8) -> list[Event]:
    spec = validate_job_spec({"name": job_id, "queue": "q", "replicas": 1, "gpus_per_replica": gpus,
                              "runtime": "sim", "duration_seconds": 600})
    return [job_event(job_id, ev.JobSubmitted, seconds, spec=spec, user="alice"),
            job_event(job_id, ev.JobAdmitted, seconds, queue="q", priority=500, replicas=1, gpus_per_replica=gpus)]


def running(job_id: str, node: str, seconds: float) -> list[Event]:
    return [*submitted(job_id, seconds),
            job_event(job_id, ev.GangReserved, seconds + 1, ranks=[ev.RankPlacement(rank=0, node=node,
                                                                                    gpus=list(range(8)))],
                      world_size=1, master_addr="127.0.0.1", master_port=29500),
            job_event(job_id, ev.JobRunning, seconds + 2)]


def pending(job_id: str, seconds: float, code: str = "GANG_DOES_NOT_FIT") -> list[Event]:
    return [*submitted(job_id, seconds),
            job_event(job_id, ev.PlacementPending, seconds + 1, reason=Reason(code=code, message="no room"))]


def two_nodes_one_running_one_pending() -> list[Event]:
    """node-0 and node-1 (8 GPUs each, racks of their own), queue q; r runs on node-0 since t+12s,
    p (8 GPUs) waits since t+20s."""
    return [*nodes("2x8:H100"), *queues(), *running("r", "node-0", 10), *pending("p", 20)]
