"""How large a submission may be, as the log and the bus record it.

Why: a JobSubmitted just under NATS' max payload (8 MiB) grows when admission re-encodes it with
the defaults filled in, and once appended, the outbox relay could never publish it: the whole
cluster would stop. The size that matters is the
recorded form (the event after defaults, with its envelope), and it must stay well below the
bus's message limit. The client checks before publishing and admission checks again (any
pipeline may publish to the inbox). Pure: sizes are computed by encoding, no I/O.
"""

from __future__ import annotations

from corral.contracts.envelope import Event
from corral.contracts.problems import Problem
from corral.contracts.registry import encode

__all__ = ["SPEC_TOO_LARGE", "recorded_size", "size_problem"]

#: Reason code of a JobRejected for a submission whose recorded form is over the limit.
SPEC_TOO_LARGE = "SPEC_TOO_LARGE"


def recorded_size(event: Event) -> int:
    """Bytes of `event` as the event store and the bus carry it."""
    return len(encode(event))


def size_problem(size: int, limit: int) -> Problem | None:
    """The problem with a submission of `size` recorded bytes under `limit`, if any."""
    if size <= limit:
        return None
    return Problem(path="spec", message=f"the submission is {size:,} bytes as recorded; the limit is "
                                        f"{limit:,} bytes (CORRAL_MAX_SPEC_BYTES)",
                   hint="keep large data out of the spec: put it in a file or object store the job "
                        "reads, and pass its path in `command` or `env`")
