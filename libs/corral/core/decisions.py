"""What one cycle decides for each pending job, and why.

Expected outcomes (a job cannot start yet) are values, never exceptions: every `Pending` carries a
`Reason` with a stable code for machines and a message with numbers for people, e.g.
"queue research/nlp uses 24 of 24 guaranteed GPUs, cohort lends 0".
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from corral.core.model import Placement


class ReasonCode(StrEnum):
    PLACED = "PLACED"
    BACKFILLED = "BACKFILLED"
    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
    MAX_GPUS_EXCEEDED = "MAX_GPUS_EXCEEDED"
    #: the job's user holds as many GPUs as a queue on its path allows one user (`core.user_gpus`)
    MAX_GPUS_PER_USER = "MAX_GPUS_PER_USER"
    GANG_DOES_NOT_FIT = "GANG_DOES_NOT_FIT"
    TOPOLOGY_UNSATISFIABLE = "TOPOLOGY_UNSATISFIABLE"
    NO_MATCHING_GPU = "NO_MATCHING_GPU"
    WAITING_FOR_PREEMPTION = "WAITING_FOR_PREEMPTION"
    RESERVED_FOR = "RESERVED_FOR"
    QUEUE_UNKNOWN = "QUEUE_UNKNOWN"
    PREEMPTED_FOR_PRIORITY = "PREEMPTED_FOR_PRIORITY"
    RECLAIMED_FOR_GUARANTEE = "RECLAIMED_FOR_GUARANTEE"
    PREEMPTED_FOR_LAS = "PREEMPTED_FOR_LAS"
    #: FAIR_LAS: smaller jobs moved (checkpoint, restart on idle GPUs elsewhere) to make a whole node for a gang
    PREEMPTED_TO_DEFRAGMENT = "PREEMPTED_TO_DEFRAGMENT"
    ORDERED_BEHIND = "ORDERED_BEHIND"
    #: every rendezvous port of rank 0's node is held by a live gang (`corral.core.rendezvous`)
    RENDEZVOUS_PORTS_EXHAUSTED = "RENDEZVOUS_PORTS_EXHAUSTED"


Detail = tuple[str, int | float | str]


@dataclass(frozen=True, slots=True)
class Reason:
    """Why a decision was taken: a stable code, a message with numbers, and the numbers as details."""

    code: ReasonCode
    message: str
    details: tuple[Detail, ...] = ()

    def detail(self, key: str) -> int | float | str | None:
        for k, v in self.details:
            if k == key:
                return v
        return None


@dataclass(frozen=True, slots=True)
class Place:
    """Start the whole gang now, exactly here."""

    job_id: str
    placement: Placement
    reason: Reason


@dataclass(frozen=True, slots=True)
class Preempt:
    """Ask `victims` to checkpoint and release their GPUs so that `job_id` (the preemptor) fits."""

    job_id: str
    victims: tuple[str, ...]
    reason: Reason


@dataclass(frozen=True, slots=True)
class Pending:
    """The job stays queued this cycle, for `reason`."""

    job_id: str
    reason: Reason


Decision = Place | Preempt | Pending
