"""On a full cluster, the tick decides the jobs that joined the wait, not every waiting job: while
the cluster, the queues and the running jobs stay as the last full cycle saw them and its first job
still waits, a new waiting job gets the reason the full cycle would give it within the tick, and
any other change (GPUs freed, the first job gone) runs the full cycle again.

Why: the tick's cycle looks at every waiting job each second, which with a deep backlog on a full
cluster keeps a core busy answering what has not changed. No NATS or Postgres (see
test_placement_idle_cycles)."""

from __future__ import annotations

import pytest

from corral.contracts import events as ev
from corral.contracts.envelope import Reason
from corral.core.steps import placement_step
from tests.unit.services.doubles import Clock, waiting
from tests.unit.services.job_events import job_event
from tests.unit.services.test_placement_idle_cycles import _setup


async def test_the_tick_decides_only_new_jobs_on_a_full_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    placement, cycles = _setup(clock, monkeypatch)
    for job_id in ("a", "b", "c"):
        placement.fold(*waiting(job_id))
    await placement._place(clock())
    assert cycles == [3] and placement.view.jobs["a"].holding, "a GPU free: a full cycle places a"
    clock.now += placement.tick_seconds
    await placement._place(clock())
    assert cycles == [3, 2], "the cluster is full now: one full cycle gives every waiting job its reason"
    clock.now += placement.tick_seconds
    await placement._place(clock())
    assert cycles == [3, 2], "nothing changed: no cycle"
    placement.fold(*waiting("d"))
    clock.now += placement.tick_seconds
    await placement._place(clock())
    assert cycles == [3, 2], "a job joined: decided with the first waiting job alone"
    full = placement_step(placement.view.snapshot(clock(), pending=list(placement._waiting.values()),
                                                  releasing=True), placement.config)
    assert placement.view.jobs["d"].reason is not None
    assert {d.job_id: d.reason.message for d in full} == \
        {j: placement.view.jobs[j].reason.message for j in ("b", "c", "d")}, "the full cycle's answers"
    placement.fold(job_event("b", ev.JobCancelled, reason=Reason(code="CANCELLED_BY_USER", message="bye")))
    clock.now += placement.tick_seconds
    await placement._place(clock())
    assert cycles == [3, 2, 2], "the first waiting job left: the full cycle again"
    gang = placement.view.jobs["a"]
    placement.fold(
        job_event("a", ev.GangReleased, attempt=gang.attempt, reason=Reason(code="COMPLETED", message="done")),
        ev.GpusReleased.new(stream="node-n1", actor="placement", correlation_id="a", job_id="a",
                            node="n1", attempt=gang.attempt, gpus=list(range(8))))
    clock.now += 0.1
    await placement._place(clock())
    assert cycles == [3, 2, 2, 2] and "node-n1" in placement.appended_streams[-1], "GPUs freed: the full cycle places"
