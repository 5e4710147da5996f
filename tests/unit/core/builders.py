"""Small builders for core tests: jobs, running jobs on explicit GPUs, snapshots."""

from __future__ import annotations

from corral.core import (
    Cluster,
    Job,
    PendingJob,
    Placement,
    QueueConfig,
    RankPlacement,
    RunningJob,
    Snapshot,
)


def job(id: str, replicas: int = 1, gpus: int = 1, queue: str = "q", **kw: object) -> Job:
    kw.setdefault("submit_time", 0.0)
    return Job(id, queue, replicas, gpus, **kw)  # type: ignore[arg-type]


def running(
    j: Job,
    ranks: list[tuple[str, tuple[int, ...]]],
    start: float = 0.0,
    checkpoint: float | None = None,
    **kw: object,
) -> RunningJob:
    placement = Placement(tuple(RankPlacement(n, node, gpus) for n, (node, gpus) in enumerate(ranks)))
    return RunningJob(j, placement, start, checkpoint, **kw)  # type: ignore[arg-type]


def snapshot(
    cluster: Cluster,
    pending: list[Job] | list[PendingJob],
    run: list[RunningJob] = (),  # type: ignore[assignment]
    queues: list[QueueConfig] | None = None,
    now: float = 1000.0,
) -> Snapshot:
    pend = tuple(p if isinstance(p, PendingJob) else PendingJob(p) for p in pending)
    qs = tuple(queues) if queues is not None else (QueueConfig("q"),)
    return Snapshot(now, cluster, qs, pend, tuple(run))
