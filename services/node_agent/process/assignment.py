"""What one node must run for one attempt of a gang, and the environment each rank gets.

Why: the environment is the contract with torch.distributed (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
...) and with `corral.worker` (`CORRAL_*`). Building it is a pure function, so it is tested without
starting processes, and the supervisor only has to pass it to `exec`.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from corral.contracts.worker import (
    DEFAULT_CHECKPOINT_SIGNAL,
    ENV_ATTEMPT,
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_SIGNAL,
    ENV_CONTROL,
    ENV_JOB_ID,
    ENV_RESUME_FROM,
    RESERVED_ENV,
    checkpoint_signal_problem,
    mount_target_problem,
)

from .run_as import WorkerUser

ROLE_NAME = "default"
"""torchrun's role of every worker (one role per job)."""



@dataclass(frozen=True)
class RankAssignment:
    """One local rank: its global `rank`, its `local_rank` on this node and its GPU indices."""

    rank: int
    local_rank: int
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class MountBind:
    """A spec mount resolved on this node: the host folder (a dataset's path here, or the spec's
    path) seen by the job at `target`."""

    host: str
    target: str
    read_only: bool = True


@dataclass(frozen=True)
class Assignment:
    """The part of a gang reservation this node runs, for one attempt.

    `attempt` counts every launch of the gang (0 first, +1 after each requeue or restart);
    `restarts` counts only crash restarts, which `max_restarts` bounds. `resume_from` is set after
    a requeue or restart and becomes `CORRAL_RESUME_FROM`. `user`: the submitter's OS account when
    the agent runs ranks as their submitter (`run_as`), else None (the agent's own user).
    """

    job_id: str
    attempt: int
    world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    ranks: tuple[RankAssignment, ...]
    command: tuple[str, ...]
    checkpoint_dir: Path
    log_dir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    resume_from: Path | None = None
    checkpoint_signal: str = DEFAULT_CHECKPOINT_SIGNAL
    max_restarts: int = 0
    restarts: int = 0
    workdir: Path | None = None
    user: WorkerUser | None = None  # the OS account the ranks run as (None: the agent's; see `run_as`)
    group_world_size: int = 1  # how many nodes the gang spans (torchrun's GROUP_WORLD_SIZE)
    runtime: str = "process"  # the `runtimes.WorkerRuntime` that starts each rank
    image: str | None = None  # the container image (podman, docker, apptainer)
    mounts: tuple[MountBind, ...] = ()
    cpus: float | None = None  # per rank, for runtimes that can limit it (containers)
    memory_gib: float | None = None
    #: `checkpoint_dir` was named by the spec (`checkpoint.dir`), not made by the agent under its
    #: checkpoint root: under run-as it is made as the submitter, never given to them (`run_as`).
    checkpoint_dir_from_spec: bool = False

    def __post_init__(self) -> None:
        if not self.job_id or "/" in self.job_id or self.job_id.startswith("."):
            raise ValueError(f"assignment: job_id {self.job_id!r} must be non-empty, without '/' "
                             "and not start with '.' (it names log and control folders)")
        if self.attempt < 0:
            raise ValueError(f"assignment {self.job_id}: attempt must be >= 0 (0 is the first run), got {self.attempt}")
        if not self.command and self.image is None:
            raise ValueError(f"assignment {self.job_id}: command is empty; give the program and its args")
        if not self.ranks:
            raise ValueError(f"assignment {self.job_id}: ranks is empty; a node runs at least one rank")
        globals_ = [r.rank for r in self.ranks]
        locals_ = [r.local_rank for r in self.ranks]
        if len(set(globals_)) != len(globals_) or len(set(locals_)) != len(locals_):
            raise ValueError(f"assignment {self.job_id}: ranks repeat a rank or local_rank: {self.ranks}")
        if not 0 <= self.node_rank < self.group_world_size:
            raise ValueError(f"assignment {self.job_id}: node_rank {self.node_rank} outside the gang's "
                             f"{self.group_world_size} node(s) (group_world_size)")
        bad = [r for r in globals_ if not 0 <= r < self.world_size]
        if bad:
            raise ValueError(f"assignment {self.job_id}: rank(s) {bad} outside world_size {self.world_size}")
        if not 0 < self.master_port < 65536:
            raise ValueError(f"assignment {self.job_id}: master_port {self.master_port} is not a TCP port")
        clash = sorted(RESERVED_ENV & set(self.env))
        if clash:
            raise ValueError(f"assignment {self.job_id}: env sets {clash}, which Corral sets itself; "
                             "remove them from the job's env")
        problem = checkpoint_signal_problem(self.checkpoint_signal)
        if problem is not None:
            raise ValueError(f"assignment {self.job_id}: checkpoint.signal: {problem}")
        for mount in self.mounts:
            hides = mount_target_problem(mount.target)
            if hides is not None:
                raise ValueError(f"assignment {self.job_id}: mount target: {hides}")
        if self.restarts < 0 or self.max_restarts < 0:
            raise ValueError(f"assignment {self.job_id}: restarts and max_restarts must be >= 0")

    def next_attempt(self, *, resume_from: Path | None, crash_restart: bool) -> Assignment:
        """The same placement launched again (after a crash restart, or a requeue that landed here)."""
        return dataclasses.replace(self, attempt=self.attempt + 1, resume_from=resume_from,
                                   restarts=self.restarts + (1 if crash_restart else 0))


AGENT_BIN = os.path.dirname(sys.executable)
"""The folder of the agent's own interpreter (not symlink-resolved: a venv's `bin`)."""


def build_rank_env(assignment: Assignment, rank: RankAssignment, control_path: Path,
                   base_env: Mapping[str, str], interpreter_bin: str = AGENT_BIN) -> dict[str, str]:
    """The complete environment of one rank's process.

    Starts from `base_env` (the agent's environment, for PATH and friends) minus every reserved
    variable, with `interpreter_bin` (the agent's own environment's `bin`) first on PATH: a job's
    `command: [python, ...]` runs the agent's interpreter, with corral (and torch, when installed)
    importable, whether or not whoever started the agent had activated its venv. Then the job's
    `env` (a job may set its own PATH), then the reserved ones. `CORRAL_RESUME_FROM` is present only
    when there is something to resume from. `PYTHONUNBUFFERED=1` is a default (the job may
    override it) so that Python output reaches the rank log as it happens.
    """
    env = {k: v for k, v in base_env.items() if k not in RESERVED_ENV}
    if interpreter_bin:
        rest = [p for p in env.get("PATH", os.defpath).split(os.pathsep) if p and p != interpreter_bin]
        env["PATH"] = os.pathsep.join([interpreter_bin, *rest])
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(assignment.env)
    env.update({
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in rank.gpus),
        # the host's indices, whatever the runtime renumbers CUDA_VISIBLE_DEVICES to (see `runtimes`);
        # reserved: in a container it is what the NVIDIA toolkit reads
        "NVIDIA_VISIBLE_DEVICES": ",".join(str(g) for g in rank.gpus) or "void",
        "RANK": str(rank.rank),
        "LOCAL_RANK": str(rank.local_rank),
        "WORLD_SIZE": str(assignment.world_size),
        "LOCAL_WORLD_SIZE": str(len(assignment.ranks)),
        "NODE_RANK": str(assignment.node_rank),
        "GROUP_RANK": str(assignment.node_rank),
        "GROUP_WORLD_SIZE": str(assignment.group_world_size),
        "ROLE_NAME": ROLE_NAME,
        "ROLE_RANK": str(rank.rank),
        "ROLE_WORLD_SIZE": str(assignment.world_size),
        "MASTER_ADDR": assignment.master_addr,
        "MASTER_PORT": str(assignment.master_port),
        "TORCHELASTIC_RUN_ID": assignment.job_id,
        "TORCHELASTIC_RESTART_COUNT": str(assignment.attempt),
        # No torchelastic agent store here: ranks create the TCPStore at MASTER_ADDR:MASTER_PORT.
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        ENV_JOB_ID: assignment.job_id,
        ENV_CHECKPOINT_DIR: str(assignment.checkpoint_dir),
        ENV_ATTEMPT: str(assignment.attempt),
        ENV_CONTROL: str(control_path),
        ENV_CHECKPOINT_SIGNAL: assignment.checkpoint_signal,
    })
    if assignment.resume_from is not None:
        env[ENV_RESUME_FROM] = str(assignment.resume_from)
    return env


def rank_log_path(assignment: Assignment, rank: RankAssignment) -> Path:
    """`<log_dir>/<job_id>/rank-<N>.log`: one file per global rank, appended across attempts."""
    return assignment.log_dir / assignment.job_id / f"rank-{rank.rank}.log"


def sim_command(duration: float, *, python: str, step_seconds: float = 0.1,
                extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The command of the `sim` runtime (see `corral.worker`)."""
    return (python, "-m", "corral.worker", "sim", "--duration", str(duration),
            "--step-seconds", str(step_seconds), *extra)
