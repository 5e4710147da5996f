"""What a `corral` command's exit status means, one meaning per code.

Why: a script tells outcomes apart by the exit code alone: one retrying on 3 (no cluster
reachable) must never retry a refusal (4) forever. One enum, `unique`, and the README's list
(checked by tests/unit/cli/test_exit_codes.py) keep them apart. Worker exit codes are another
protocol (`corral.contracts.worker.WorkerExit`).
"""

from __future__ import annotations

from enum import IntEnum, unique

__all__ = ["ExitCode"]


@unique
class ExitCode(IntEnum):
    OK = 0
    #: the request failed: a bad spec, an unknown job, a submission admission rejected
    FAILURE = 1
    #: the command line itself is wrong (typer/click use 2 too)
    USAGE = 2
    #: no cluster reachable (no context, or nothing answers at its addresses): try again later
    NO_CLUSTER = 3
    #: the cluster answered and said no: the owning service refused the request (not the job's
    #: owner: AccessDenied; a queue change refused), or the evidence gate did
    REFUSED = 4
    #: the request was sent but its service gave no verdict within the wait: it waits in the
    #: service's inbox and may still be acted on (see `corral why` / `corral events`)
    NO_VERDICT = 5
