"""`corral why JOB`: a job's decision trail, and for a job that waits, what blocks it and what
would unblock it."""

from __future__ import annotations

from typing import Any

from corral.cli.job_commands import _details, _summary, _waited
from corral.cli.present import release_hint, unblock_detail, waiting_reason
from corral.client import Client
from corral.projection import JobState


async def why(c: Client, job: str, now: float) -> dict[str, Any] | None:
    """Every event of `job` (when, which version, who, the reason or what it did), its state, and
    its blocker at `now` (epoch seconds) when it is held or pending; None if the log has no such job."""
    trail = await c.job_events(job)
    if not trail:
        return None
    view = await c.live_view(job_ids=[job])
    j = view.jobs.get(job)
    if j is None:
        return None
    steps = []
    for stored, event in trail:
        reason = getattr(event, "reason", None)
        steps.append({
            "at": stored.occurred_at.isoformat(), "version": stored.version, "event": stored.type,
            "actor": event.actor, "code": reason.code if reason is not None else None,
            "message": reason.message if reason is not None else _summary(event),
            "details": dict(reason.details) if reason is not None else _details(event),
        })
    blocker: dict[str, Any] | None = None
    if j.state is JobState.HELD and j.reason is not None:
        blocker = {"code": j.reason.code, "message": j.reason.message, "unblock": f"corral release {job}",
                   "after_release": release_hint(view, j, now)}
    elif j.state is JobState.PENDING:
        code, message = waiting_reason(j) or ("WAITING", "waiting for the next scheduling cycle")
        blocker = {"code": code, "message": message,
                   **(unblock_detail(view, j, now) or {"unblock": None})}
        if j.wait_exceeded is not None:
            blocker["wait_exceeded"] = _details(j.wait_exceeded) | {
                "at": j.wait_exceeded.occurred_at.isoformat(), "words": _waited(j.wait_exceeded)}
    return {"id": job, "state": j.state.value, "trail": steps, "blocker": blocker}
