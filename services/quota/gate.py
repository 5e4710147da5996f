"""The evidence gate of a queue tree change, decided by quota.

The gates in force are the standing ones of the last recorded version (a queues file's `gates`,
`ClusterView.standing_gates`);
a change must pass them, the ones it declares and its own `require` criteria. What a request says
about its evidence is never read: quota replays the recorded workload (`corral.sim.whatif`) under
the current and the proposed tree and records the checks itself, so a client that skips
`--require` still meets the standing gates, and one that lies records nothing it claims.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from corral.contracts import events as ev
from corral.contracts.envelope import Event
from corral.contracts.flow import names
from corral.contracts.queues import Gate, QueueSpec, gate_criteria, parse_gate
from corral.contracts.registry import decode
from corral.eventstore import EventStore
from corral.projection import ClusterView
from corral.sim.from_log import export_inputs, workload_from_events
from corral.sim.whatif import criterion_of, what_if

__all__ = ["GateVerdict", "judge"]

#: What the replay is built from (`corral.sim.from_log.workload_from_events`).
REPLAYED = names((ev.JobSubmitted, ev.JobRejected, ev.JobRunning, ev.JobCompleted, ev.JobFailed, ev.JobCancelled,
                  ev.NodeRegistered, ev.QueueConfigured))
_PAGE = 5000


@dataclass(frozen=True)
class GateVerdict:
    """The checks of every criterion, and why the change is refused (None: it passed)."""

    checks: list[ev.GateCheck]
    refused: str | None


async def judge(store: EventStore, view: ClusterView, request: ev.QueueTreeApplied,
                proposed: Sequence[QueueSpec]) -> GateVerdict:
    """Check every criterion of `request` against a what-if of the recorded workload."""
    texts = gate_criteria(view.standing_gates(), request.gates, request.require)
    if not texts:
        return GateVerdict([], None)
    try:
        gates = [parse_gate(text, where="gate") for text in texts]
    except ValueError as exc:
        return GateVerdict([], str(exc))
    events = await _replayed(store)
    current = list(view.queues.values())
    checks, missing = await asyncio.to_thread(_checks, events, current, list(proposed), gates, request.what_if_since,
                                              view.policy)
    if missing:
        return GateVerdict(checks, missing)
    misses = sum(not c.passed for c in checks)
    if misses:
        return GateVerdict(checks, f"the what-if misses {misses} of {len(checks)} criteria; nothing applied")
    return GateVerdict(checks, None)


async def _replayed(store: EventStore) -> list[Event]:
    events: list[Event] = []
    after = 0
    while batch := await store.read_all(after, limit=_PAGE, types=REPLAYED):
        events.extend(decode(stored.data) for stored in batch)
        after = batch[-1].position
    return events


def _checks(events: list[Event], current: list[QueueSpec], proposed: list[QueueSpec], gates: list[Gate],
            since: datetime | None, policy: str) -> tuple[list[ev.GateCheck], str | None]:
    """The what-if's checks under the cluster's `policy` (run in a thread: a replay takes a while
    on a long log)."""
    lines, cluster, _ = workload_from_events(events, since)
    if not lines or not cluster["nodes"]:
        return [], "the log holds no admitted submissions or no registered nodes to replay: no gate can be met"
    with tempfile.TemporaryDirectory(prefix="corral-gate-") as tmp:
        exported = export_inputs(events, Path(tmp), since=since)
        assert exported.cluster is not None
        result = what_if(exported.trace, exported.cluster, current, proposed, policy=policy)
    return [criterion_of(g).check(result) for g in gates], None
