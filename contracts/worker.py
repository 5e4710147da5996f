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
from typing import Literal, get_args

__all__ = [
    "CHECKPOINTED_EXIT_CODE",
    "CHECKPOINT_SIGNALS",
    "CHOSEN_EXITS",
    "DEFAULT_CHECKPOINT_SIGNAL",
    "ENV_ATTEMPT",
    "ENV_CHECKPOINT_DIR",
    "ENV_CHECKPOINT_SIGNAL",
    "ENV_CONTROL",
    "ENV_JOB_ID",
    "ENV_RESUME_FROM",
    "MOUNT_TARGET_HINT",
    "RESERVED_ENV",
    "SYSTEM_FOLDERS",
    "TORCH_ENV",
    "CheckpointSignal",
    "ControlKind",
    "WorkerExit",
    "checkpoint_signal_problem",
    "mount_target_problem",
    "signal_from_name",
]


class WorkerExit(IntEnum):
    """Exit codes with a meaning for Corral; any other code (or a signal) is a crash."""

    COMPLETED = 0
    CHECKPOINTED = 85  # stopped on purpose after writing a checkpoint (`corral.worker.exit_checkpointed`)


CHECKPOINTED_EXIT_CODE: int = WorkerExit.CHECKPOINTED.value
"""A rank exits with this after a checkpoint was written: stopped on purpose, resumable."""

CHOSEN_EXITS: frozenset[int] = frozenset(WorkerExit)
"""The exits a rank chose (completed or checkpointed): it ran; every other exit is a crash."""

DEFAULT_CHECKPOINT_SIGNAL = "SIGUSR1"
"""The signal that asks a rank to checkpoint unless the job spec names another (as Slurm's `--signal`)."""

# The environment the agent sets for every rank (beside torch.distributed's RANK, WORLD_SIZE, ...).
ENV_CHECKPOINT_SIGNAL = "CORRAL_CHECKPOINT_SIGNAL"  # the checkpoint signal's name, e.g. SIGUSR1
ENV_CHECKPOINT_DIR = "CORRAL_CHECKPOINT_DIR"  # where the job writes its checkpoints
ENV_RESUME_FROM = "CORRAL_RESUME_FROM"  # the checkpoint to resume from (set after a requeue or restart)
ENV_CONTROL = "CORRAL_CONTROL"  # this rank's control file: it appends one JSON line per report
ENV_JOB_ID = "CORRAL_JOB_ID"
ENV_ATTEMPT = "CORRAL_ATTEMPT"  # which attempt of the job this is, counted from 0 (the first run)

TORCH_ENV = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE",
)
"""What torchrun gives each worker, which every rank gets too (listed in the README), so a script
written for torchrun runs unchanged."""

RESERVED_ENV = frozenset({
    "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", *TORCH_ENV,
    ENV_JOB_ID, ENV_CHECKPOINT_DIR, ENV_RESUME_FROM, ENV_ATTEMPT,
    ENV_CONTROL, ENV_CHECKPOINT_SIGNAL,
})
"""Variables the agent sets for every rank: inherited values are dropped and a job may not set
them (the job spec refuses them, and so does the agent, from this one set)."""

CheckpointSignal = Literal["SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGALRM", "SIGCONT",
                           "SIGURG", "SIGWINCH", "SIGXCPU", "SIGVTALRM", "SIGPROF"]
CHECKPOINT_SIGNALS: tuple[str, ...] = get_args(CheckpointSignal)
"""The signals a job may name to be told to checkpoint: those a process can catch, by the names
every platform of the agents knows (SIGKILL and SIGSTOP cannot be caught)."""


class ControlKind(StrEnum):
    """The `kind` of a record a rank appends to its control file (`CORRAL_CONTROL`)."""

    CHECKPOINT = "checkpoint"  # {"kind", "path", "step", "rank", "attempt", "pid"}: a checkpoint is durable


def checkpoint_signal_problem(name: str) -> str | None:
    """Why `name` cannot be a job's checkpoint signal, or None when it can."""
    if name in CHECKPOINT_SIGNALS:
        return None
    if name in ("SIGKILL", "SIGSTOP"):
        return f"{name} cannot be caught, so the job could never checkpoint on it"
    return f"`{name}` is not a signal a job can be told to checkpoint with"


SYSTEM_FOLDERS = ("/proc", "/dev", "/sys", "/etc")
"""Folders of the node a mount may not hide: every program needs them, and the runtime makes the
first three for the job itself (so nothing may be mounted inside those either)."""
_KERNEL_FOLDERS = SYSTEM_FOLDERS[:3]
MOUNT_TARGET_HINT = ("mount somewhere else, e.g. /data, /mnt/<name> or /home/<you>/<name> (any folder but /, "
                     "/proc, /dev, /sys, /etc and what lies in /proc, /dev or /sys)")


def mount_target_problem(target: str) -> str | None:
    """Why a mount may not be seen at `target` (it would hide a system folder), or None when it may."""
    path = "/" + "/".join(p for p in target.split("/") if p and p != ".")
    if path == "/":
        return f"`{target}` would hide the whole system folder tree (/)"
    if path in SYSTEM_FOLDERS:
        return f"`{target}` would hide the node's system folder {path}, which every program needs"
    inside = next((folder for folder in _KERNEL_FOLDERS if path.startswith(folder + "/")), None)
    if inside is not None:
        return f"`{target}` lies in the system folder {inside}, which the runtime makes for the job"
    return None


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
