"""Placement runs its cycle over every job holding quota on an event only when that cycle could place
one: while no GPU is free, a new waiting job (or one cancelled while waiting) changes no placement,
and the cycle waits for the tick, which decides every waiting job's reason as before.

Why: the cycle looks at every waiting job, so with a deep backlog (bench/cli.py) a cycle after
each `corral submit` and `corral cancel` keeps a core busy, and the next command's process and the
services answering it wait for a core behind it. No NATS or Postgres: the cycle's runs are
counted, its appends recorded.
"""

from __future__ import annotations

from typing import Any

import pytest

from corral.contracts import events as ev
from corral.contracts.cluster import GpuDevice
from corral.contracts.envelope import Reason, node_stream
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.queues import QueueSpec
from corral.services.placement import service as placement_module
from corral.services.placement.service import Placement
from tests.unit.services.job_events import job_event


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class CountingPlacement(Placement):
    """Placement whose appends fold as a real append does; the view is built by `fold`."""

    def __init__(self, clock: Clock) -> None:
        stand_in: Any = object()
        super().__init__(stand_in, stand_in, clock=clock, monotonic=clock)
        self.appended: list[list[str]] = []

    async def append(self, batches: Any, **_: Any) -> bool:
        batches = {stream: events for stream, events in batches.items() if events}
        if batches:
            self.appended.append(sorted(batches))
            self._fold_appended(batches, {})
        return True

    def fold(self, *events: Any) -> None:
        for e in events:
            self.view.apply(e)
            self.folded(e)


_job = job_event


def _waiting(job_id: str) -> list[Any]:
    """A job of 8 GPUs holding quota, waiting for GPUs."""
    spec = validate_job_spec({"name": job_id, "queue": "q", "gpus_per_replica": 8, "runtime": "sim",
                              "duration_seconds": 86400})
    return [_job(job_id, ev.JobSubmitted, spec=spec),
            _job(job_id, ev.JobAdmitted, queue="q", priority=0, replicas=1, gpus_per_replica=8),
            _job(job_id, ev.QuotaReserved, queue="q", gpus=8, borrowed=0)]


def _setup(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> tuple[CountingPlacement, list[int]]:
    cycles: list[int] = []
    real = placement_module.placement_step

    def counted(snapshot: Any, *args: Any, **kwargs: Any) -> Any:
        cycles.append(len(snapshot.pending))
        return real(snapshot, *args, **kwargs)

    monkeypatch.setattr(placement_module, "placement_step", counted)
    placement = CountingPlacement(clock)
    placement.fold(
        ev.QueueConfigured.new(stream="queue-q", actor="test", queue=QueueSpec(name="q", guaranteed_gpus=8)),
        ev.NodeRegistered.new(stream=node_stream("n1"), actor="agent", node="n1",
                              gpus=[GpuDevice(index=i, model="H100") for i in range(8)],
                              nvlink_domains=[list(range(8))], rack="r", zone="z"))
    return placement, cycles


async def test_a_new_waiting_job_runs_no_cycle_while_no_gpu_is_free(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    placement, cycles = _setup(clock, monkeypatch)
    placement.fold(*_waiting("a"))
    await placement._place(clock())
    assert cycles == [1] and placement.view.jobs["a"].holding, "a GPU free: the job is placed at once"
    placement.fold(*_waiting("b"))
    clock.now += 0.5
    await placement._place(clock())
    assert cycles == [1], "no GPU is free: the cycle could place nothing, it waits for the tick"
    clock.now += placement.tick_seconds
    await placement._place(clock())
    assert cycles == [1, 1] and placement.view.jobs["b"].reason is not None, \
        "the tick decides every waiting job: the new one's reason is recorded"
    placement.fold(*_waiting("c"))
    placement.fold(_job("b", ev.JobCancelled, reason=Reason(code="CANCELLED_BY_USER", message="bye")))
    clock.now += 0.5
    await placement._place(clock())
    assert cycles == [1, 1], "a waiting job cancelled frees no GPU either"
    clock.now += placement.tick_seconds
    await placement._place(clock())
    assert cycles == [1, 1, 1] and placement.view.jobs["c"].reason is not None


async def test_freed_gpus_run_the_cycle_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    placement, cycles = _setup(clock, monkeypatch)
    placement.fold(*_waiting("a"))
    await placement._place(clock())
    placement.fold(*_waiting("b"))
    clock.now += 0.1
    await placement._place(clock())
    assert len(cycles) == 1
    gang = placement.view.jobs["a"]
    placement.fold(
        _job("a", ev.GangReleased, attempt=gang.attempt, reason=Reason(code="COMPLETED", message="done")),
        ev.GpusReleased.new(stream=node_stream("n1"), actor="placement", correlation_id="a", job_id="a",
                            node="n1", attempt=gang.attempt, gpus=list(range(8))))
    clock.now += 0.1
    await placement._place(clock())
    assert len(cycles) == 2 and placement.view.jobs["b"].holding, "GPUs freed: the next job is placed at once"
