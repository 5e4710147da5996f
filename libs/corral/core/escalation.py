"""Escalation: which waiting jobs have waited longer than their queue's `max_wait`, once per wait.

Why: a job can wait for hours behind a blocker nobody looks at (a queue over its ceiling,
a gang no node shape fits yet, a node drained and forgotten); `corral why` explains it only to
whoever asks. A queue's `max_wait` turns "too long" into a fact in the log: one WaitExceeded per
wait, carrying the blocker, that `corral jobs --stuck`, the metrics and alerts can act on.

The rule, here once for quota (which records the events), `corral jobs --stuck` and the metrics:
- a wait starts when a job is admitted, requeued, or released from a hold (the caller says when);
- the limit is the `max_wait` of the job's queue, or of the nearest queue above it that sets one;
- a wait is past its limit when it has lasted strictly longer than the limit at `now`;
- each wait is escalated once: a wait already escalated (the log says so, also after a restart)
  is never escalated again; a new wait (a requeue) may be.

Pure: waits, limits and `now` in, values out; no clock (the service passes its own).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["Overdue", "Wait", "limit_of", "next_deadline", "overdue", "stuck", "to_escalate"]


@dataclass(frozen=True, slots=True)
class Wait:
    """One job's current wait: since when, and whether it was already escalated (with the limit
    used then: `escalated_limit` is (queue, seconds), None while not escalated)."""

    job_id: str
    queue: str
    since: float
    escalated_limit: tuple[str, float] | None = None

    @property
    def escalated(self) -> bool:
        return self.escalated_limit is not None


@dataclass(frozen=True, slots=True)
class Overdue:
    """A wait past its limit at `now`: `limit_queue`'s `max_wait` applies to it."""

    job_id: str
    queue: str
    limit_queue: str
    max_wait: float
    since: float
    waited: float
    escalated: bool

    @property
    def past(self) -> float:
        """Seconds beyond the limit."""
        return self.waited - self.max_wait


def limit_of(queue: str, limits: Mapping[str, float | None]) -> tuple[str, float] | None:
    """The queue whose `max_wait` applies to a job of `queue`, and that limit: the queue's own,
    else its nearest ancestor's (`research/nlp` -> `research`); None when no queue on the path sets one."""
    name: str | None = queue
    while name is not None:
        limit = limits.get(name)
        if limit is not None:
            return name, limit
        name = name.rsplit("/", 1)[0] if "/" in name else None
    return None


def overdue(waits: Iterable[Wait], limits: Mapping[str, float | None], now: float) -> list[Overdue]:
    """Every wait past its queue's limit at `now`, escalated or not, longest wait first."""
    out = []
    for w in waits:
        limit = limit_of(w.queue, limits)
        if limit is not None and now - w.since > limit[1]:
            out.append(Overdue(w.job_id, w.queue, limit[0], limit[1], w.since, now - w.since, w.escalated))
    return sorted(out, key=lambda o: (o.since, o.job_id))


def to_escalate(waits: Iterable[Wait], limits: Mapping[str, float | None], now: float) -> list[Overdue]:
    """The waits to record a WaitExceeded for now: past their limit and not escalated yet."""
    return [o for o in overdue(waits, limits, now) if not o.escalated]


def stuck(waits: Iterable[Wait], limits: Mapping[str, float | None], now: float) -> list[Overdue]:
    """What `corral jobs --stuck` lists: waits past their limit now, and waits escalated under a
    limit since raised or removed (the escalation stands until the job stops waiting); longest first."""
    waits = list(waits)
    found = {o.job_id: o for o in overdue(waits, limits, now)}
    for w in waits:
        if w.escalated_limit is not None and w.job_id not in found:
            queue, limit = w.escalated_limit
            found[w.job_id] = Overdue(w.job_id, w.queue, queue, limit, w.since, now - w.since, True)
    return sorted(found.values(), key=lambda o: (o.since, o.job_id))


def next_deadline(waits: Iterable[Wait], limits: Mapping[str, float | None]) -> float | None:
    """The earliest moment a wait not yet escalated passes its limit (None: no such wait)."""
    deadlines = [w.since + limit[1] for w in waits if not w.escalated
                 for limit in [limit_of(w.queue, limits)] if limit is not None]
    return min(deadlines, default=None)
