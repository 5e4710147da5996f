"""The codes of admission's verdicts: why a submission is rejected before it ever waits.

Why an enum here: a rejection is final and read by people and scripts (`corral submit` exits 1
with it, `corral why` shows it); the codes are part of the contract, never bare strings. Codes of
the scheduling core's static checks (TOPOLOGY_UNSATISFIABLE, NO_MATCHING_GPU, ...) keep their
core names.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["RejectionCode"]


class RejectionCode(StrEnum):
    QUEUE_UNKNOWN = "QUEUE_UNKNOWN"
    """The job names a queue that does not exist."""
    QUEUE_NOT_LEAF = "QUEUE_NOT_LEAF"
    """The job names a queue that has child queues; jobs go to leaves."""
    PRIORITY_ABOVE_QUEUE_MAX = "PRIORITY_ABOVE_QUEUE_MAX"
    """The job's priority is above its queue's `max_priority`."""
    EXCEEDS_CLUSTER = "EXCEEDS_CLUSTER"
    """The job needs more (matching) GPUs than the whole cluster has."""
    ACCESS_DENIED_QUEUE = "ACCESS_DENIED_QUEUE"
    """The submitting identity is not among the queue's `submitters`."""
    SPEC_INVALID = "SPEC_INVALID"
    """The submitted spec breaks the JobSpec contract (a client that skipped `corral validate`):
    only the rejection is recorded, with every problem's field and fix."""
    LIMIT_SUBMITTED = "LIMIT_SUBMITTED"
    """The user already has `max_submitted_per_user` jobs pending or running in the queue (or the
    queue above it that sets the limit): Slurm's MaxSubmitJobsPerUser."""
    RATE_LIMITED = "RATE_LIMITED"
    """The user submits faster than the queue's `submit_rate_per_user` allows, past its burst;
    `details.retry_after_seconds` says when a token is back."""
    NOT_OWNER = "NOT_OWNER"
    """A cancellation by someone who neither owns the job nor is an admin (an AccessDenied event)."""
