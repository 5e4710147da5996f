"""Which adopted gangs placement still wants: the log's word on each (job, attempt) on this node.

Why: a restarted agent finds stepds still running gangs (see `supervisor.adopt`). While the
agent was down, placement may have released them (the node looked lost, the job was
cancelled, a newer attempt was placed elsewhere); their ranks then hold GPUs placement believes
free. Only the log can say, so the agent folds the relevant events of the events stream at start
(`ReservationLedger`) and stops every adopted gang the log does not keep on this node.

Pure: events in, verdicts out. Attempts here are the contracts' (0-based).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from corral.contracts.envelope import Event
from corral.contracts.events import (
    GangReleased,
    GangReserved,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobRejected,
    JobRequeued,
)

LEDGER_TYPES: tuple[type[Event], ...] = (GangReserved, GangReleased, JobRequeued, JobCompleted, JobFailed,
                                         JobCancelled, JobRejected)
"""The event classes the ledger folds."""


class Verdict(enum.StrEnum):
    KEEP = "keep"  # the log holds this attempt reserved on this node
    ENDED = "ended"  # the job ended
    RELEASED = "released"  # this attempt was released, or the job was requeued past it
    SUPERSEDED = "superseded"  # a newer attempt was reserved
    ELSEWHERE = "elsewhere"  # this attempt was reserved, but not on this node
    UNKNOWN = "unknown"  # never reserved, as far as the log says


@dataclass
class _Job:
    attempt: int | None = None  # newest reserved attempt
    nodes: frozenset[str] = frozenset()
    released: set[int] = field(default_factory=set)
    requeued_to: int = -1
    ended: bool = False


class ReservationLedger:
    """Per job: its newest reservation, the attempts released, whether it ended."""

    def __init__(self) -> None:
        self._jobs: dict[str, _Job] = {}

    def fold(self, event: Event) -> None:
        if isinstance(event, GangReserved):
            job = self._jobs.setdefault(event.job_id, _Job())
            if job.attempt is None or event.attempt >= job.attempt:
                job.attempt = event.attempt
                job.nodes = frozenset(r.node for r in event.ranks)
        elif isinstance(event, GangReleased):
            self._jobs.setdefault(event.job_id, _Job()).released.add(event.attempt)
        elif isinstance(event, JobRequeued):
            job = self._jobs.setdefault(event.job_id, _Job())
            job.requeued_to = max(job.requeued_to, event.attempt)
        elif isinstance(event, JobCompleted | JobFailed | JobCancelled | JobRejected):
            self._jobs.setdefault(event.job_id, _Job()).ended = True

    def verdict(self, job_id: str, attempt: int, node: str) -> Verdict:
        """What the log says of `attempt` (0-based) of `job_id` running on `node`."""
        job = self._jobs.get(job_id)
        if job is None:
            return Verdict.UNKNOWN
        if job.ended:
            return Verdict.ENDED
        if attempt in job.released or job.requeued_to > attempt:
            return Verdict.RELEASED
        if job.attempt is None:
            return Verdict.UNKNOWN
        if job.attempt > attempt:
            return Verdict.SUPERSEDED
        if job.attempt < attempt:
            return Verdict.UNKNOWN
        return Verdict.KEEP if node in job.nodes else Verdict.ELSEWHERE


def should_stop(verdict: Verdict, *, history_complete: bool) -> bool:
    """Stop an adopted gang unless the log keeps it here. "Never reserved" counts only when the
    stream still holds everything since before the gang was launched (`history_complete`): an
    events stream with a max age may have dropped the reservation of a long-running gang."""
    if verdict is Verdict.KEEP:
        return False
    if verdict is Verdict.UNKNOWN:
        return history_complete
    return True
