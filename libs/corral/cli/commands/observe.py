"""`corral usage`, `corral top` and `corral dlq`: GPU-hours from the log, the cluster now for each
frame, and the messages the services could never process."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import Any

from corral.accounting import EVENT_TYPES, GroupBy, UsageRow, Window, grouped, job_usage, total
from corral.client import Client
from corral.contracts.problems import ContractError
from corral.contracts.registry import decode
from corral.projection import ClusterView

#: Events read from the log per batch.
BATCH = 5000


async def usage(c: Client, window: Window, by: GroupBy) -> tuple[list[UsageRow], UsageRow]:
    """GPU-hours used, waited and lost within `window`, one row per `by`, and their total."""
    events, after = [], 0
    while batch := await c.store.read_all(after, limit=BATCH, types=EVENT_TYPES):
        for stored in batch:
            with contextlib.suppress(ContractError):
                events.append(decode(stored.data))
        after = batch[-1].position
    rows = grouped(job_usage(events, window).values(), by)
    return rows, total(rows)


async def top_view(c: Client) -> ClusterView:
    """The cluster now for a frame of `corral top`, read again for each frame: the read model's
    view (`Client.live_view`: the stored view and the log after it), which costs the active jobs
    and the nodes, not the log."""
    return await c.live_view()


async def dead_letters(c: Client, now: datetime | None = None) -> list[dict[str, Any]]:
    """Each dead letter: where it came from, how often it was delivered, its error and age."""
    from corral.bus.dead_letters import list_dead_letters

    at = now or datetime.now(UTC)
    return [{"seq": d.seq, "subject": d.subject, "consumer": d.consumer, "deliveries": d.deliveries,
             "error": d.error, "age_seconds": d.age_seconds(at), "origin_stream": d.origin_stream,
             "origin_seq": d.origin_seq, "msg_id": d.msg_id, "bytes": len(d.data)}
            for d in await list_dead_letters(c.bus)]


async def replay_dead_letters(c: Client, seq: int | None) -> list[dict[str, Any]]:
    """Ask a service to republish dead letter `seq` (None: every one); each one's outcome."""
    from corral.cli.commands import CommandError

    try:
        return await c.replay_dead_letters(seq)
    except RuntimeError as exc:
        raise CommandError(str(exc)) from None
