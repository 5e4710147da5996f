"""The worker protocol: what the node agent and a job's processes say to each other.

Why here: the agent (`corral.services.node_agent`) and the helper a workload imports
(`corral.worker`) must agree on the environment variable names, the exit codes, the checkpoint
signal and the control-file record. They were defined in `corral.worker`, so the agent imported a
module meant to run inside jobs, and the checkpointed exit code was defined twice (there and in
`contracts/lifecycle.py`). As contracts, both sides import one definition and import-linter keeps
the agent from depending on the job-side helper.

Standard library only, like `corral.worker`: workloads import this (through `corral.worker`), so it
must cost nothing to import (the `corral.contracts` package resolves its own re-exports lazily).

Exit codes (what the agent concludes from a rank's exit):

* ``0``  -- `WorkerExit.COMPLETED`: the rank finished its work.
* ``85`` -- `WorkerExit.CHECKPOINTED`: the rank stopped on purpose after a checkpoint was written
  (by itself or by a peer rank); not a failure, uses no restart.
* any other code, or death by a signal outside a preemption -- a crash.
"""

from __future__ import annotations

import signal
from enum import IntEnum, StrEnum

__all__ = [
    "CHECKPOINTED_EXIT_CODE",
    "DEFAULT_CHECKPOINT_SIGNAL",
    "ENV_ATTEMPT",
    "ENV_CHECKPOINT_DIR",
    "ENV_CHECKPOINT_SIGNAL",
    "ENV_CONTROL",
    "ENV_JOB_ID",
    "ENV_RESUME_FROM",
    "ControlKind",
    "WorkerExit",
    "signal_from_name",
]


class WorkerExit(IntEnum):
    """Exit codes with a meaning for Corral; any other code (or a signal) is a crash."""

    COMPLETED = 0
    CHECKPOINTED = 85  # stopped on purpose after writing a checkpoint (`corral.worker.exit_checkpointed`)


CHECKPOINTED_EXIT_CODE: int = WorkerExit.CHECKPOINTED.value
"""A rank exits with this after a checkpoint was written: stopped on purpose, resumable."""

DEFAULT_CHECKPOINT_SIGNAL = "SIGUSR1"
"""The signal that asks a rank to checkpoint unless the job spec names another (as Slurm's `--signal`)."""

# The environment the agent sets for every rank (beside torch.distributed's RANK, WORLD_SIZE, ...).
ENV_CHECKPOINT_SIGNAL = "CORRAL_CHECKPOINT_SIGNAL"  # the checkpoint signal's name, e.g. SIGUSR1
ENV_CHECKPOINT_DIR = "CORRAL_CHECKPOINT_DIR"  # where the job writes its checkpoints
ENV_RESUME_FROM = "CORRAL_RESUME_FROM"  # the checkpoint to resume from (set after a requeue or restart)
ENV_CONTROL = "CORRAL_CONTROL"  # this rank's control file: it appends one JSON line per report
ENV_JOB_ID = "CORRAL_JOB_ID"
ENV_ATTEMPT = "CORRAL_ATTEMPT"  # which attempt of the job this is, counted from 0 (the first run)


class ControlKind(StrEnum):
    """The `kind` of a record a rank appends to its control file (`CORRAL_CONTROL`)."""

    CHECKPOINT = "checkpoint"  # {"kind", "path", "step", "rank", "attempt", "pid"}: a checkpoint is durable


def signal_from_name(name: str) -> signal.Signals:
    """`SIGUSR1`, `USR1` or a number -> the signal; a clear error names the variable otherwise."""
    text = name.strip().upper()
    if text.isdigit():
        return signal.Signals(int(text))
    if not text.startswith("SIG"):
        text = "SIG" + text
    try:
        return signal.Signals[text]
    except KeyError:
        raise ValueError(
            f"{ENV_CHECKPOINT_SIGNAL}={name!r} is not a signal name; use e.g. SIGUSR1 or SIGUSR2"
        ) from None
