"""`corral nodes`, `queues`, `events` and `replay`: the cluster's nodes and queues, the audit log
and the cluster as it was at a past moment, read from the event log (sinfo / sacct)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from corral.cli.present import job_row, node_rows, queue_rows
from corral.client import Client
from corral.projection import ClusterView

#: Seconds `follow` waits before asking the log for what was appended since.
FOLLOW_POLL = 0.5


async def nodes(c: Client, *, rack: str | None = None, state: str | None = None) -> list[dict[str, Any]]:
    """Each node's row (`present.node_rows`), only those of `rack` and in `state` when given: from
    the nodes and the jobs whose released GPUs are still held (`Client.nodes_view`), not every job."""
    return [r for r in node_rows(await c.nodes_view())
            if (rack is None or r["rack"] == rack) and (state is None or r["state"] == state)]


async def queues(c: Client) -> list[dict[str, Any]]:
    return queue_rows(await c.live_view())


@dataclass(frozen=True)
class EventFilter:
    """Which events of the log `corral events` lists: of a job, of some types, from a time."""

    job: str | None = None
    types: Sequence[str] | None = None
    start: datetime | None = None

    def keeps(self, stored: Any, event: Any) -> bool:
        if self.job and stored.correlation_id != self.job and getattr(event, "job_id", None) != self.job \
                and getattr(event, "victim_job_id", None) != self.job:
            return False
        return self.start is None or stored.occurred_at >= self.start


def event_row(stored: Any, event: Any) -> dict[str, Any]:
    reason = getattr(event, "reason", None) or getattr(event, "blocker", None)  # WaitExceeded: its blocker
    return {"position": stored.position, "at": stored.occurred_at.isoformat(), "stream": stored.stream,
            "type": stored.type, "actor": event.actor,
            "job": getattr(event, "job_id", None) or getattr(event, "victim_job_id", None),
            "reason": f"{reason.code}: {reason.message}" if reason is not None else ""}


async def events(c: Client, where: EventFilter, limit: int) -> list[dict[str, Any]]:
    """The log's events `where` keeps, the newest `limit` of them (0: all), oldest first."""
    types = list(where.types) if where.types is not None else None
    rows = [event_row(s, e) for s, e in await c.events(types=types) if where.keeps(s, e)]
    return rows[-limit:] if limit else rows


async def follow(c: Client, where: EventFilter, after: int | None) -> AsyncIterator[list[dict[str, Any]]]:
    """The rows of the events appended after position `after` (None: the log's head now), a batch
    each time some come; it never ends by itself."""
    from corral.contracts.registry import decode

    position = after if after is not None else await c.store.head_position()
    while True:
        new = []
        for stored in await c.store.read_all(position, limit=1000):
            position = stored.position
            event = decode(stored.data)
            if (where.types is None or stored.type in where.types) and where.keeps(stored, event):
                new.append(event_row(stored, event))
        if new:
            yield new
        await asyncio.sleep(FOLLOW_POLL)


def state_of(view: ClusterView) -> dict[str, Any]:
    """The cluster state a replay and the live services agree on (used by `replay` and its tests)."""
    return {
        "position": view.position,
        "jobs": {j.job_id: {"state": j.state.value, "attempt": j.attempt,
                            "ranks": [[r.rank, r.node, list(r.gpus)] for r in j.ranks] if j.holding else [],
                            "quota_gpus": j.quota_gpus, "reason": j.reason.code if j.reason else None}
                 for j in sorted(view.jobs.values(), key=lambda j: j.job_id)},
        "nodes": {n["node"]: {"state": n["state"], "allocations": n["allocations"]} for n in node_rows(view)},
        "queues": {q["queue"]: q["in_use"] for q in queue_rows(view)},
    }


@dataclass(frozen=True)
class Replayed:
    """The cluster at `moment`, rebuilt from the log alone: its state (`state_of`), the jobs not
    finished then (their AGE as it was), and the queue tree in force."""

    moment: datetime
    state: dict[str, Any]
    jobs: list[dict[str, Any]]
    tree: dict[str, Any]


async def replay(c: Client, moment: datetime) -> Replayed:
    view = await c.view(until=moment)
    rows = [job_row(j, moment) for j in sorted(view.jobs.values(), key=lambda j: j.job_id) if not j.state.terminal]
    tree = {"version": len(view.tree_versions),
            "queues": {q.name: {"guaranteed_gpus": q.guaranteed_gpus, "max_gpus": q.max_gpus,
                                "weight": q.weight} for q in view.queues.values()}}
    return Replayed(moment, state_of(view), rows, tree)
