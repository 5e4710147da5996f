"""Admission's per-user limits: the queues file's limits as the core's, the ledger kept as the log is
folded, and a refusal in the words a person reads.

The rules are the core's (`corral.core.submit_limits`); this module only picks their inputs out of
the events admission folds and words the refusal: LIMIT_SUBMITTED names the limit, the queue that
sets it and the count; RATE_LIMITED names the rate and when to retry.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from corral.contracts import events as ev
from corral.contracts.admission import RejectionCode
from corral.contracts.envelope import Event, Reason
from corral.contracts.flow import names
from corral.contracts.problems import Problem
from corral.contracts.queues import QueueSpec
from corral.core.submit_limits import OverCount, OverRate, SubmitLedger, UserLimits
from corral.projection import ClusterView

__all__ = ["UserLimitsFold", "refusal_of"]

#: The events that end a job's count (by name: admission writes only the first).
_ENDS = frozenset(names((ev.JobRejected, ev.JobCompleted, ev.JobFailed, ev.JobCancelled)))


class UserLimitsFold:
    """The ledger of `SubmitLedger`, folded from the events admission folds into `view`."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view
        self.ledger = SubmitLedger()
        self._limits: dict[str, tuple[QueueSpec, UserLimits]] = {}

    def limits(self, queue: str) -> UserLimits | None:
        """The per-user limits `queue` sets now (None: an unknown queue)."""
        spec = self.view.queues.get(queue)
        if spec is None:
            return None
        cached = self._limits.get(queue)
        if cached is None or cached[0] is not spec:
            rate = spec.submit_rate_per_user
            cached = self._limits[queue] = (spec, UserLimits(
                max_submitted=spec.max_submitted_per_user,
                rate_per_minute=rate.per_minute if rate is not None else None,
                burst=rate.burst if rate is not None else None))
        return cached[1]

    def fold(self, event: Event) -> None:
        """`event` was just folded into the view (`Service.folded`)."""
        if isinstance(event, ev.JobSubmitted):
            self.ledger.submitted(event.job_id, event.user or "", event.spec.queue)
        elif event.type in _ENDS:
            self.ledger.ended(getattr(event, "job_id", ""))
        elif isinstance(event, ev.JobAdmitted):
            job = self.view.jobs.get(event.job_id)
            if job is not None and job.spec is not None and job.submitted_at is not None:
                self.ledger.admitted(job.user or "", job.spec.queue, job.submitted_at.timestamp(), self.limits)

    def judge(self, submitted: ev.JobSubmitted, ledger: SubmitLedger | None = None) -> tuple[Problem, Reason] | None:
        """Why `submitted` (as received) is over a limit of its user, or None; `ledger`: a scratch
        copy with the submissions judged before it in the same batch."""
        on = ledger if ledger is not None else self.ledger
        user = submitted.user or ""
        found = on.refusal(user, submitted.spec.queue, submitted.occurred_at.timestamp(), self.limits)
        return None if found is None else refusal_of(found, submitted.user, submitted.occurred_at)

    def judged(self, ledger: SubmitLedger, submitted: ev.JobSubmitted, verdict: Event) -> None:
        """Count a submission judged in a batch in `ledger` (a scratch copy) as the log will."""
        if isinstance(verdict, ev.JobAdmitted):
            user, queue = submitted.user or "", submitted.spec.queue
            ledger.submitted(submitted.job_id, user, queue)
            ledger.admitted(user, queue, submitted.occurred_at.timestamp(), self.limits)


def refusal_of(found: OverCount | OverRate, user: str | None, at: datetime) -> tuple[Problem, Reason]:
    who = user or "an unnamed user"
    if isinstance(found, OverCount):
        message = (f"{who} has {found.count} jobs pending or running in queue `{found.queue}`, its "
                   f"max_submitted_per_user is {found.limit}")
        return (Problem(path="queue", message=message,
                        hint="wait for one of your jobs to end (or cancel one: `corral jobs --user "
                             f"{user or '...'}`), or ask an admin to raise max_submitted_per_user of "
                             f"queue `{found.queue}`"),
                Reason(code=RejectionCode.LIMIT_SUBMITTED, message=message,
                       details=_details(user, found.queue, limit=found.limit, count=found.count)))
    wait = round(found.retry_after, 3)
    retry_at = (at + timedelta(seconds=found.retry_after)).astimezone(UTC)
    message = (f"{who} submits to queue `{found.queue}` faster than its submit_rate_per_user "
               f"({found.per_minute:g} a minute after a burst of {found.burst}); retry in {wait:g}s")
    return (Problem(path="queue", message=message,
                    hint=f"submit again after {retry_at.isoformat(timespec='seconds')} (in {wait:g}s), or "
                         "spread submissions out"),
            Reason(code=RejectionCode.RATE_LIMITED, message=message,
                   details=_details(user, found.queue, per_minute=found.per_minute, burst=found.burst,
                                    retry_after_seconds=wait, retry_at=retry_at.isoformat())))


def _details(user: str | None, queue: str, **figures: object) -> dict[str, object]:
    return {"user": user or "unknown", "queue": queue, **figures}
