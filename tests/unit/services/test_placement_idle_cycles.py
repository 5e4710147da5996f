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
from corral.contracts.envelope import Reason, node_stream
from corral.services.placement import service as placement_module
from tests.unit.services.doubles import Clock, FoldingPlacement, one_node, waiting
from tests.unit.services.job_events import job_event


def _setup(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> tuple[FoldingPlacement, list[int]]:
    cycles: list[int] = []
    real = placement_module.placement_step

    def counted(snapshot: Any, *args: Any, **kwargs: Any) -> Any:
        cycles.append(len(snapshot.pending))
        return real(snapshot, *args, **kwargs)

    monkeypatch.setattr(placement_module, "placement_step", counted)
    placement = FoldingPlacement(clock)
    one_node(placement, guaranteed_gpus=8)
    return placement, cycles


async def test_a_new_waiting_job_runs_no_cycle_while_no_gpu_is_free(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    placement, cycles = _setup(clock, monkeypatch)
    placement.fold(*waiting("a"))
    await placement._place(clock())
    assert cycles == [1] and placement.view.jobs["a"].holding, "a GPU free: the job is placed at once"
    placement.fold(*waiting("b"))
    clock.now += 0.5
    await placement._place(clock())
    assert cycles == [1], "no GPU is free: the cycle could place nothing, it waits for the tick"
    clock.now += placement.tick_seconds
    await placement._place(clock())
    assert cycles == [1, 1] and placement.view.jobs["b"].reason is not None, \
        "the tick decides every waiting job: the new one's reason is recorded"
    placement.fold(*waiting("c"))
    placement.fold(job_event("b", ev.JobCancelled, reason=Reason(code="CANCELLED_BY_USER", message="bye")))
    clock.now += 0.5
    await placement._place(clock())
    assert cycles == [1, 1], "a waiting job cancelled frees no GPU either"
    clock.now += placement.tick_seconds
    await placement._place(clock())
    assert cycles == [1, 1, 1] and placement.view.jobs["c"].reason is not None


async def test_freed_gpus_run_the_cycle_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    placement, cycles = _setup(clock, monkeypatch)
    placement.fold(*waiting("a"))
    await placement._place(clock())
    placement.fold(*waiting("b"))
    clock.now += 0.1
    await placement._place(clock())
    assert len(cycles) == 1
    gang = placement.view.jobs["a"]
    placement.fold(
        job_event("a", ev.GangReleased, attempt=gang.attempt, reason=Reason(code="COMPLETED", message="done")),
        ev.GpusReleased.new(stream=node_stream("n1"), actor="placement", correlation_id="a", job_id="a",
                            node="n1", attempt=gang.attempt, gpus=list(range(8))))
    clock.now += 0.1
    await placement._place(clock())
    assert len(cycles) == 2 and placement.view.jobs["b"].holding, "GPUs freed: the next job is placed at once"
