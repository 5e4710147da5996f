"""Logs of varied job lives, for the read-model tests (unit and integration).

Each job follows one of a few paths (completed, failed, cancelled while waiting, preempted and
placed again, running, waiting), and some finished jobs get late events (a WorkerExited after the
job is over, a cancel request for a completed job): the events a stored view must not lose.
Events of different jobs interleave, as in a live log.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from corral.contracts import events as ev
from corral.contracts.cluster import parse_cluster_shorthand
from corral.contracts.envelope import Event, Reason, job_stream, node_stream, queue_stream
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.queues import QueueSpec

PATHS = ("completed", "failed", "cancelled", "preempted", "running", "waiting", "late_exit", "late_cancel")
T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _r(code: str) -> Reason:
    return Reason(code=code, message=code.lower())


def _life(job: str, node: str, path: str, t: datetime) -> Iterator[Event]:
    """One job's events; `node` is the node it runs on (it holds all 8 GPUs there while placed)."""
    s = job_stream(job)

    def e(cls: type[Event], stream: str = s, **payload: Any) -> Event:
        nonlocal t
        t += timedelta(seconds=1)
        return cls.new(stream=stream, actor="test", correlation_id=job, now=t, **payload)

    spec = validate_job_spec({"name": job, "queue": "q", "replicas": 2, "gpus_per_replica": 4, "runtime": "sim",
                              "duration_seconds": 60})
    yield e(ev.JobSubmitted, job_id=job, spec=spec, user="alice")
    yield e(ev.JobAdmitted, job_id=job, queue="q", priority=500, replicas=2, gpus_per_replica=4)
    if path in ("cancelled", "waiting"):
        yield e(ev.PlacementPending, job_id=job, reason=_r("INSUFFICIENT_GPUS"))
        if path == "cancelled":
            yield e(ev.JobCancelled, job_id=job, reason=_r("CANCELLED"))
        return
    yield e(ev.QuotaReserved, job_id=job, queue="q", gpus=8)
    attempts = 2 if path == "preempted" else 1
    for attempt in range(attempts):
        ranks = [ev.RankPlacement(rank=r, node=node, gpus=[4 * r + g for g in range(4)]) for r in (0, 1)]
        yield e(ev.GangReserved, job_id=job, ranks=ranks, world_size=2, master_addr="127.0.0.1",
                master_port=29500, attempt=attempt)
        for r in (0, 1):
            yield e(ev.WorkerStarted, job_id=job, rank=r, node=node, pid=100 + r, attempt=attempt)
        yield e(ev.JobRunning, job_id=job, attempt=attempt)
        if path == "running" or (path == "preempted" and attempt == 1):
            return
        if path == "preempted":
            yield e(ev.PreemptRequested, victim_job_id=job, for_job_id="other", deadline=t + timedelta(seconds=30),
                    reason=_r("PREEMPTED"))
            yield e(ev.CheckpointDone, job_id=job, path="/ckpt/1", attempt=attempt)
        failed = path == "failed"
        for r in (0, 1) if path != "late_exit" else (0,):
            yield e(ev.WorkerExited, job_id=job, rank=r, node=node, exit_code=1 if failed else 0, attempt=attempt,
                    reason=_r("EXITED"))
        code = "PREEMPTED" if path == "preempted" else ("WORKER_FAILED" if failed else "COMPLETED")
        yield e(ev.GangReleased, job_id=job, reason=_r(code), attempt=attempt)
        if path == "preempted":
            yield e(ev.GpusReleased, stream=node_stream(node), node=node, job_id=job, gpus=list(range(8)),
                    attempt=attempt)
            yield e(ev.JobRequeued, job_id=job, reason=_r("PREEMPTED"), attempt=attempt + 1, resume_from="/ckpt/1")
            continue
        yield e(ev.JobFailed, job_id=job, reason=_r(code)) if failed else e(ev.JobCompleted, job_id=job)
        yield e(ev.GpusReleased, stream=node_stream(node), node=node, job_id=job, gpus=list(range(8)))
        yield e(ev.QuotaReleased, job_id=job, queue="q", gpus=8, reason=_r("RELEASED"))
    if path == "late_exit":  # rank 1's report arrives after the job is over
        yield e(ev.WorkerExited, job_id=job, rank=1, node=node, exit_code=0, reason=_r("EXITED"))
    if path == "late_cancel":
        yield e(ev.JobCancelRequested, job_id=job, user="alice", message="too late")


def varied_log(jobs: int, seed: int = 0, nodes: int = 4) -> list[Event]:
    """Nodes and a queue, then `jobs` job lives interleaved: each node runs one placed job at a
    time (a job's GPUs are released before the next job on that node is placed)."""
    rnd = random.Random(seed)
    out: list[Event] = []
    for inv in parse_cluster_shorthand(f"{nodes}x8:H100").inventories():
        out.append(ev.NodeRegistered.new(stream=node_stream(inv.node), actor="test", node=inv.node, gpus=inv.gpus,
                                         nvlink_domains=inv.nvlink_domains, rack=inv.rack, zone=inv.zone, now=T0))
    out.append(ev.QueueConfigured.new(stream=queue_stream("q"), actor="test", queue=QueueSpec(name="q"), now=T0))
    names = [inv.node for inv in parse_cluster_shorthand(f"{nodes}x8:H100").inventories()]
    busy: set[str] = set()  # nodes whose last placed job still holds them (running, or placed again)
    placed: list[Event] = []
    waiting: list[list[Event]] = []
    for i in range(jobs):
        path = rnd.choice(PATHS)
        free = [n for n in names if n not in busy]
        if path not in ("cancelled", "waiting") and not free:
            path = "waiting"
        node = free[0] if path not in ("cancelled", "waiting") else names[0]
        if path in ("running", "preempted"):
            busy.add(node)
        life = list(_life(f"job-{i:03d}", node, path, T0 + timedelta(minutes=i)))
        if path in ("cancelled", "waiting"):
            waiting.append(life)
        else:
            placed.extend(life)  # one placed life after another: a node's GPUs are freed before reuse
    # The waiting lives interleave with the rest, each in its own order.
    keyed = [(float(k), e) for k, e in enumerate(placed)]
    for life in waiting:
        keys = sorted(rnd.uniform(0, len(placed)) for _ in life)
        keyed += list(zip(keys, life, strict=True))
    keyed.sort(key=lambda item: item[0])
    return out + [e for _, e in keyed]
