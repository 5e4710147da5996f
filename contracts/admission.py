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
    NOT_OWNER = "NOT_OWNER"
    """A cancellation by someone who neither owns the job nor is an admin (an AccessDenied event)."""
