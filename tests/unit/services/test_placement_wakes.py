"""Placement's reconcile is woken by what may change its decisions, not by what it only folds.

Why: a job's JobSubmitted and JobAdmitted reach placement a few milliseconds before its
QuotaReserved; a reconcile after them decided nothing, and the QuotaReserved then waited out the
run loop's `reconcile_interval` behind it (an idle cluster's submit -> start, bench/README.md).
No NATS or Postgres: deliveries are handed to `on_event`.
"""

from __future__ import annotations

from typing import Any

from corral.bus import Delivery
from corral.contracts import events as ev
from corral.contracts.envelope import Reason
from corral.contracts.registry import encode
from tests.unit.services.doubles import Clock, FoldingPlacement, one_node, waiting
from tests.unit.services.job_events import job_event


def _delivery(event: Any, version: int) -> Delivery:
    return Delivery(subject=f"ns.events.{event.type}", data=encode(event),
                    headers={"Corral-Stream": event.stream, "Corral-Stream-Version": str(version)},
                    delivery_count=1, stream="ns-events", stream_sequence=version, consumer_sequence=version,
                    timestamp=None)


async def test_a_submission_and_its_admission_are_folded_without_waking_the_reconcile() -> None:
    placement = FoldingPlacement(Clock())
    one_node(placement, guaranteed_gpus=8)
    submitted, admitted, reserved = waiting("j1")
    pending = job_event("j1", ev.PlacementPending, reason=Reason(code="QUEUE_QUOTA_EXHAUSTED", message="wait"))
    for version, event in enumerate((submitted, admitted, pending), start=1):
        placement.changed.clear()
        await placement.on_event(_delivery(event, version))
        assert not placement.changed.is_set(), event.type
    assert placement.view.versions["job-j1"] == 3  # folded all the same
    await placement.on_event(_delivery(reserved, 4))
    assert placement.changed.is_set()  # it may be placed now
