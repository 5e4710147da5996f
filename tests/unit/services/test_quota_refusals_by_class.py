"""Quota records the same events whether the round names every refusal or keeps them per class.

The round's answer (`corral.core.reservation.QuotaRound`) names the jobs it walked and gives every
other waiting job its class's reason; the service asks of each of those whether its reason is news
without a call per job (`Quota._refusals`). Here a backlog behind a full queue, some of it told a
reason already (the same words, other numbers, another code), is decided by the compact answer and
by one naming every job (`reserve_quota`), and both must append the same events.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import corral.services.quota.service as quota_service
from corral.contracts import events as ev
from corral.contracts.cluster import GpuDevice
from corral.contracts.envelope import Event, Reason, node_stream, queue_stream
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.queues import QueueSpec
from corral.core.reservation import QuotaRound, reserve_quota
from corral.services.quota.service import Quota

T0 = datetime(2026, 12, 7, tzinfo=UTC)


class Recording(Quota):
    def __init__(self) -> None:
        stand_in: Any = object()
        super().__init__(stand_in, stand_in, clock=lambda: 2_000_000_000.0, monotonic=lambda: 100.0)
        self.appended: list[Event] = []

    async def append(self, batches: Any, **_: Any) -> bool:
        self.appended.extend(e for events in batches.values() for e in events)
        return True


def fold(quota: Quota, e: Event) -> None:
    if quota.view.apply(e) is not None:
        quota.folded(e)


def world(quota: Quota, told: dict[int, Reason]) -> None:
    base = {"actor": "test", "now": T0}
    fold(quota, ev.NodeRegistered.new(stream=node_stream("n1"), node="n1", nvlink_domains=[list(range(8))],
                                      gpus=[GpuDevice(index=i, model="H100") for i in range(8)], rack="r", zone="z",
                                      **base))
    fold(quota, ev.QueueConfigured.new(stream=queue_stream("a"), queue=QueueSpec(name="a", guaranteed_gpus=4,
                                                                              max_gpus=4, allow_root=True), **base))
    for i in range(120):
        job = f"j{i:03d}"
        gpus = 1 + i % 3
        at = {**base, "stream": f"job-{job}", "correlation_id": job, "now": T0 + timedelta(seconds=i)}
        spec = validate_job_spec({"name": job, "queue": "a", "replicas": 1, "gpus_per_replica": gpus,
                                  "runtime": "sim", "duration_seconds": 1})
        fold(quota, ev.JobSubmitted.new(**at, job_id=job, spec=spec, user="u"))
        fold(quota, ev.JobAdmitted.new(**at, job_id=job, queue="a", priority=i % 2, replicas=1, gpus_per_replica=gpus))
        if i in told:
            fold(quota, ev.PlacementPending.new(**at, job_id=job, reason=told[i]))


def every_job_named(snapshot: Any, config: Any, *, backlog: Any = None, **kw: Any) -> QuotaRound:
    """`reserve_quota`: the plain definition, deriving what the service's kept `backlog` holds."""
    return QuotaRound(reserve_quota(snapshot, config, **kw), {}, False)


def said(events: list[Event]) -> list[tuple[str, str, str]]:
    return sorted((type(e).__name__, getattr(e, "job_id", ""), repr(getattr(e, "reason", None))) for e in events)


@pytest.mark.parametrize("rounds", [1, 2])
async def test_the_compact_round_records_what_naming_every_job_records(monkeypatch: pytest.MonkeyPatch,
                                                                      rounds: int) -> None:
    full = "queue a uses 4 of max 4 GPUs; job needs {} more"
    told = {i: Reason(code="MAX_GPUS_EXCEEDED", message=full.format(1 + i % 3)) for i in range(0, 120, 2)}
    told |= {i: Reason(code="MAX_GPUS_EXCEEDED", message="queue a uses 3 of max 4 GPUs; job needs 3 more")
             for i in range(1, 60, 6)}
    told |= {i: Reason(code="GANG_DOES_NOT_FIT", message="no room") for i in range(3, 120, 10)}
    outcomes = []
    for decide in (None, every_job_named):
        if decide is not None:
            monkeypatch.setattr(quota_service, "quota_round", decide)
        quota = Recording()
        world(quota, told)
        for _ in range(rounds):
            await quota._reserve()
        outcomes.append(said(quota.appended))
    compact, named = outcomes
    assert compact == named
    kinds = {kind for kind, _, _ in compact}
    assert kinds == {"QuotaReserved", "PlacementPending"}  # not vacuous: both kinds are recorded
    assert sum(kind == "PlacementPending" for kind, _, _ in compact) < 120 - 4  # and some were not news


async def test_a_round_over_a_few_jobs_is_decided_on_the_loop_and_a_backlog_beside_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a quiet cluster's job is not handed to a thread and back on its way to its GPUs
    threads: list[Any] = []
    real = quota_service.asyncio.to_thread

    async def counted(func: Any, *args: Any, **kwargs: Any) -> Any:
        threads.append(func)
        return await real(func, *args, **kwargs)

    monkeypatch.setattr(quota_service.asyncio, "to_thread", counted)
    few, many = Recording(), Recording()
    monkeypatch.setattr(few, "inline_jobs", 200)  # the 120 waiting jobs of `world` are few here
    world(few, {})
    world(many, {})
    await few._reserve()
    assert threads == []
    await many._reserve()
    assert len(threads) == 1
    assert [(e.type, e.job_id) for e in few.appended] == [(e.type, e.job_id) for e in many.appended]
    assert any(isinstance(e, ev.QuotaReserved) for e in few.appended)
