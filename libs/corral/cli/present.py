"""Rows for people and scripts, computed from the folded log (one function per listing).

Why separate from the commands: the table and the `--json` form of a listing come from the same
row dictionaries, so they can never disagree, and tests check the rows directly.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from corral.projection import ClusterView, JobState, JobView

if TYPE_CHECKING:
    from corral.core import hints


def age(at: datetime | None, now: datetime | None = None) -> str:
    if at is None:
        return ""
    seconds = int(((now or datetime.now(UTC)) - at).total_seconds())
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


#: The code `waiting_reason` gives a job quota reserved that placement has not decided yet.
DECIDING = "QUOTA_RESERVED"


def waiting_reason(j: JobView) -> tuple[str, str] | None:
    """(code, message) of why `j` is where it is, as the fold says: its last reason, or, for a job
    quota reserved that placement has said nothing of yet (`JobView.deciding`), exactly that."""
    if j.reason is not None:
        return j.reason.code, j.reason.message
    if j.deciding and j.quota_reserved_at is not None:
        at = j.quota_reserved_at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        return DECIDING, (f"quota reserved {j.quota_gpus} GPUs at {at}; not placed yet, and placement has "
                          "recorded no reason: it records why a job waits once it has waited longer than its "
                          "first-reason grace (CORRAL_FIRST_REASON_GRACE_SECONDS, default 1 s)")
    return None


def job_row(j: JobView, now: datetime | None = None) -> dict[str, Any]:
    reason = waiting_reason(j)
    return {
        "id": j.job_id,
        "name": j.spec.name if j.spec else "",
        "queue": j.queue,
        "user": j.user or "",
        "prio": j.priority,
        "state": j.state.value,
        "gpus": j.gpus,
        "nodes": ",".join(j.nodes) if j.holding else "",
        "age": age(j.submitted_at, now),
        "reason": "" if j.state in (JobState.RUNNING, JobState.COMPLETED) or reason is None
        else f"{reason[0]}: {reason[1]}",
        "attempt": j.attempt,
        "submitted_at": j.submitted_at.isoformat() if j.submitted_at else None,
    }


JOB_COLUMNS = ["ID", "NAME", "QUEUE", "PRIO", "STATE", "GPUS", "NODES", "AGE", "REASON"]


def seconds_text(seconds: float) -> str:
    """A span for people: 45s, 12m, 3h10m, 2d4h."""
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"


def stuck_rows(view: ClusterView, now: float) -> list[dict[str, Any]]:
    """`corral jobs --stuck`: jobs waiting past their queue's max_wait (`core.escalation.stuck`),
    longest wait first, with how long past it and what blocks them now; `escalated_at` is their
    WaitExceeded's time (None: quota has not recorded it yet, e.g. it is down)."""
    rows = []
    from corral.core import escalation

    for due in escalation.stuck(view.waits(), view.max_waits(), now):
        j = view.jobs[due.job_id]
        exceeded = j.wait_exceeded
        rows.append({
            "id": j.job_id, "name": j.spec.name if j.spec else "", "queue": j.queue, "user": j.user or "",
            "gpus": j.gpus, "attempt": j.attempt,
            "waiting_since": datetime.fromtimestamp(due.since, UTC).isoformat(),
            "waited_seconds": round(due.waited, 3), "max_wait_seconds": due.max_wait, "limit_queue": due.limit_queue,
            "past_seconds": round(due.past, 3),
            "escalated_at": exceeded.occurred_at.isoformat() if exceeded is not None else None,
            "blocker_code": blocker[0] if (blocker := waiting_reason(j)) else None,
            "blocker_message": blocker[1] if blocker else None,
        })
    return rows


STUCK_COLUMNS = ["ID", "QUEUE", "GPUS", "WAITED", "MAX_WAIT", "PAST", "ESCALATED", "BLOCKER"]


def stuck_table_row(row: dict[str, Any], now: datetime) -> list[Any]:
    at = row["escalated_at"]
    escalated = "not yet" if at is None else age(datetime.fromisoformat(at), now) + " ago"
    limit = seconds_text(row["max_wait_seconds"])
    if row["limit_queue"] != row["queue"]:
        limit += f" ({row['limit_queue']})"
    blocker = f"{row['blocker_code']}: {row['blocker_message']}" if row["blocker_code"] else "no reason recorded yet"
    return [row["id"], row["queue"], row["gpus"], seconds_text(row["waited_seconds"]), limit,
            seconds_text(row["past_seconds"]), escalated, blocker]


def job_detail(j: JobView) -> dict[str, Any]:
    row = job_row(j)
    row.update({
        "spec": None if j.spec is None else _spec_dict(j.spec),
        "ranks": [{"rank": r.rank, "node": r.node, "gpus": list(r.gpus)} for r in j.ranks],
        "quota_gpus": j.quota_gpus,
        "borrowed": j.borrowed,
        "checkpoint": j.checkpoint,
        "resume_from": j.resume_from,
        "restarts": j.restarts,
        "preempted_by": sorted(j.preempted_by),
        "running_since": j.running_since.isoformat() if j.running_since else None,
        "ended_at": j.ended_at.isoformat() if j.ended_at else None,
        "reason_code": reason[0] if (reason := waiting_reason(j)) else None,
        "reason_message": reason[1] if reason else None,
    })
    return row


def _spec_dict(spec: Any) -> dict[str, Any]:
    import msgspec

    built: dict[str, Any] = msgspec.to_builtins(spec)
    return built


def unblock_hint(view: ClusterView, job: JobView, now: float) -> str | None:
    """What would let a pending job start, in words: the core's hint (`core.hints.unblock`, the
    cycle rerun on what-if states of the folded log), worded by the core (`core.hints.describe`)."""
    from corral.core import hints

    hint = _hint(view, job, now)
    return None if hint is None else hints.describe(hint, now)


def release_hint(view: ClusterView, job: JobView, now: float) -> str | None:
    """For a held job: what would let it start once released (`corral release`), as the hint of a
    pending job is: the same what-if, with it back among the waiting jobs; None for any other job."""
    from corral.core import hints

    if job.state is not JobState.HELD or job.spec is None:
        return None
    waiting = [j for j in view.active.values() if j.state is JobState.PENDING and j.spec is not None]
    config = view.scheduler_config()
    snapshot = view.snapshot(now, [*waiting, job], releasing=True, config=config)
    return hints.describe(hints.unblock(snapshot, job.job_id, config), now)


def blocker_standing(view: ClusterView, job: JobView, now: float) -> str:
    """The fair-share state behind a pending job's wait (its queue against its guarantee, the queues
    ahead of it that take freed GPUs, the queues that borrow), or "" for a job not pending."""
    from corral.core import hints

    hint = _hint(view, job, now)
    return "" if hint is None else hints.fair_share_words(hint)


def unblock_detail(view: ClusterView, job: JobView, now: float) -> dict[str, Any] | None:
    """`corral why --json`'s blocker fields: the hint's words, its events and the fair-share state."""
    from corral.core import hints

    hint = _hint(view, job, now)
    if hint is None:
        return None
    return {
        "unblock": hints.describe(hint, now),
        "fair_share": hints.fair_share_words(hint),
        "unblock_kind": hint.kind.value,
        "unblock_events": [{"kind": type(e).__name__, **dataclasses.asdict(e)} for e in hint.events],
        "taken_by": [{"job": t.job_id, "queue": t.queue, "gpus": t.gpus} for t in hint.takers],
    }


def _hint(view: ClusterView, job: JobView, now: float) -> hints.Hint | None:
    from corral.core import hints  # the cycle rerun on what-ifs: only for the commands that explain

    if job.state is not JobState.PENDING or job.spec is None:
        return None
    # every waiting job (the ones ahead of it take GPUs first); GPUs still fenced are not free;
    # the cycle rerun under the cluster's policy, as the services decide
    config = view.scheduler_config()
    snapshot = view.snapshot(now, releasing=True, config=config)
    if all(p.job.id != job.job_id for p in snapshot.pending):
        return None
    return hints.unblock(snapshot, job.job_id, config)


#: The rows of `corral nodes` and `corral queues` live in corral.summary (the services' metrics
#: report the same figures), re-exported here for the commands; loaded when first asked for (it
#: loads the core's fair share and quota tree), so `corral jobs` and `show` do not.
_SUMMARY = ("SUMMARY_ABOVE", "allocated_gpus", "natural_key", "node_rows", "queue_rows", "rack_rows")


def __getattr__(name: str) -> Any:
    if name in _SUMMARY:
        import corral.summary

        return getattr(corral.summary, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
