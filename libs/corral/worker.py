"""The small helper a workload imports to cooperate with the Corral node agent.

Why: preemption with checkpoint needs the workload's help. The agent sends a signal (SIGUSR1 by
default, like Slurm's `--signal`); the workload notices it at a safe point, writes a checkpoint,
tells the agent where it is, and exits with `CHECKPOINTED_EXIT_CODE`. On the next attempt the agent
sets `CORRAL_RESUME_FROM` and the workload continues from that step instead of starting over.

Exit-code conventions (what the node agent concludes from a rank's exit):

* ``0``  -- the rank finished its work (``completed``).
* ``85`` -- ``CHECKPOINTED_EXIT_CODE``: the rank stopped on purpose after a checkpoint was written
  (by itself or by a peer rank); it is *not* a failure and does not consume a restart.
* any other code, or death by a signal outside a preemption -- a crash (``crashed``); the agent kills
  the rest of the gang on the node and the restart policy decides.

This module is stdlib-only on purpose: workloads import it, so it must cost nothing to import. The
protocol's names (environment variables, exit codes, the signal) are defined in
`corral.contracts.worker`, also stdlib-only, and re-exported here.

It is also the `sim` runtime: ``python -m corral.worker sim --duration S`` sleeps for S seconds in
small steps, keeping a step counter, and honours the checkpoint signal -- one machine can then host
many fake nodes whose "training" behaves like the real thing towards the agent.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import NoReturn

# The protocol itself lives in the contracts (the agent imports it from there); re-exported here
# for workloads that import these names from `corral.worker`.
from corral.contracts.worker import (
    CHECKPOINTED_EXIT_CODE,
    DEFAULT_CHECKPOINT_SIGNAL,
    ENV_ATTEMPT,
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_SIGNAL,
    ENV_CONTROL,
    ENV_JOB_ID,
    ENV_RESUME_FROM,
    ControlKind,
    WorkerExit,
    signal_from_name,
)

__all__ = [
    "CHECKPOINTED_EXIT_CODE",
    "DEFAULT_CHECKPOINT_SIGNAL",
    "ENV_ATTEMPT",
    "ENV_CHECKPOINT_DIR",
    "ENV_CHECKPOINT_SIGNAL",
    "ENV_CONTROL",
    "ENV_JOB_ID",
    "ENV_RESUME_FROM",
    "WorkerExit",
    "atomic_write",
    "checkpoint_dir",
    "checkpoint_requested",
    "exit_checkpointed",
    "install",
    "report_checkpoint",
    "resume_path",
    "signal_from_name",
]

_FALLBACK_CHECKPOINT_DIR = "corral-checkpoints"

_checkpoint_requested = False


def _on_checkpoint_signal(signum: int, frame: FrameType | None) -> None:
    global _checkpoint_requested
    _checkpoint_requested = True


def install(signal_name: str | None = None) -> signal.Signals:
    """Install the checkpoint-signal handler (call once, early, from the main thread).

    The signal comes from `signal_name`, else from `CORRAL_CHECKPOINT_SIGNAL`, else SIGUSR1. The
    handler only sets a flag: the workload polls `checkpoint_requested()` at a step boundary, where
    its state is consistent, instead of being interrupted mid-update.
    """
    sig = signal_from_name(signal_name or os.environ.get(ENV_CHECKPOINT_SIGNAL) or DEFAULT_CHECKPOINT_SIGNAL)
    signal.signal(sig, _on_checkpoint_signal)
    return sig


def checkpoint_requested() -> bool:
    """True once the agent asked for a checkpoint (the signal arrived after `install()`)."""
    return _checkpoint_requested


def resume_path() -> Path | None:
    """The checkpoint to resume from (set by the agent after a requeue or restart), else None."""
    value = os.environ.get(ENV_RESUME_FROM)
    return Path(value) if value else None


def checkpoint_dir() -> Path:
    """Where this job writes checkpoints (created if missing).

    Outside Corral (no `CORRAL_CHECKPOINT_DIR`) a `corral-checkpoints` folder in the working
    directory is used, so a workload also runs standalone.
    """
    path = Path(os.environ.get(ENV_CHECKPOINT_DIR) or _FALLBACK_CHECKPOINT_DIR)
    path.mkdir(parents=True, exist_ok=True)
    return path


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` so a reader (or a kill mid-write) never sees a torn checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def report_checkpoint(path: Path | str, step: int) -> None:
    """Tell the agent a checkpoint is complete at `path` for `step`.

    One JSON line is appended to the `CORRAL_CONTROL` file with a single `write` on an O_APPEND
    descriptor, so the agent (which tails the file) reads either the whole line or none of it.
    Call it only after the checkpoint file itself is durable (see `atomic_write`). Outside Corral
    (no `CORRAL_CONTROL`) it does nothing.
    """
    control = os.environ.get(ENV_CONTROL)
    if not control:
        return
    record = {
        "kind": ControlKind.CHECKPOINT.value,
        "path": str(Path(path).resolve()),
        "step": int(step),
        "rank": int(os.environ.get("RANK", "0")),
        "attempt": int(os.environ.get(ENV_ATTEMPT, "0")),
        "pid": os.getpid(),
    }
    line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    fd = os.open(control, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def exit_checkpointed() -> NoReturn:
    """Stop after a checkpoint with the documented exit code (see module docstring)."""
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(CHECKPOINTED_EXIT_CODE)


# --- the `sim` runtime -------------------------------------------------------------------------


def _read_sim_step(path: Path) -> int:
    data = json.loads(path.read_text())
    step = data.get("step")
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"checkpoint {path} has no valid 'step' field (a non-negative integer)")
    return step


def _sim_checkpoint(rank: int, attempt: int, step: int) -> None:
    if rank == 0:
        target = checkpoint_dir() / f"sim-attempt{attempt}-step{step}.json"
        atomic_write(target, json.dumps({"step": step}).encode())
        report_checkpoint(target, step)


def run_sim(duration: float, step_seconds: float, fail_at_step: int | None, fail_rank: int,
            fail_on_attempt: int, fail_code: int, checkpoint_every: int | None = None) -> int:
    """Sleep `duration` seconds in steps of `step_seconds`, honouring the checkpoint signal.

    Rank 0 writes the checkpoint (`{"step": n}`) and reports it; the other ranks just stop with the
    checkpointed code, as in a data-parallel job where one copy of the state is enough. The
    `--fail-*` options make a chosen rank crash at a chosen step so crash handling can be exercised;
    `checkpoint_every` makes rank 0 also checkpoint periodically (what a crash restart resumes from).
    """
    install()
    rank = int(os.environ.get("RANK", "0"))
    attempt = int(os.environ.get(ENV_ATTEMPT, "0"))
    total_steps = max(1, round(duration / step_seconds))
    resume = resume_path()
    step = _read_sim_step(resume) if resume else 0
    print(f"sim rank={rank} attempt={attempt} start step={step} total={total_steps}", flush=True)
    asked = False
    while step < total_steps:
        if checkpoint_requested() and not asked:
            asked = True
            try:
                _sim_checkpoint(rank, attempt, step)
            except OSError as exc:
                # A checkpoint that cannot be written (its folder full) is no checkpoint: say so
                # and go on; the preemption falls back to its grace (SIGTERM, then SIGKILL) and
                # the job resumes from its last checkpoint that was written.
                print(f"sim rank={rank} checkpoint failed at step={step}: {exc}; running on until stopped",
                      flush=True)
            else:
                print(f"sim rank={rank} checkpointed step={step}", flush=True)
                return CHECKPOINTED_EXIT_CODE
        if fail_at_step is not None and step == fail_at_step and rank == fail_rank \
                and attempt == fail_on_attempt:
            print(f"sim rank={rank} crashing at step={step} code={fail_code}", flush=True)
            return fail_code
        time.sleep(step_seconds)
        step += 1
        print(f"sim rank={rank} step={step}", flush=True)
        if checkpoint_every and step % checkpoint_every == 0 and step < total_steps:
            try:
                _sim_checkpoint(rank, attempt, step)
            except OSError as exc:  # the next one may be written; a restart resumes from the last that was
                print(f"sim rank={rank} checkpoint failed at step={step}: {exc}", flush=True)
    print(f"sim rank={rank} done step={step}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m corral.worker", description=__doc__.split("\n")[0])
    runtimes = parser.add_subparsers(dest="runtime", required=True)
    sim = runtimes.add_parser("sim", help="sleep for a declared duration, honouring the checkpoint signal")
    sim.add_argument("--duration", type=float, required=True, help="seconds of simulated work")
    sim.add_argument("--step-seconds", type=float, default=0.1, help="length of one step (default 0.1)")
    sim.add_argument("--fail-at-step", type=int, default=None, help="crash when reaching this step")
    sim.add_argument("--fail-rank", type=int, default=0, help="the global rank that crashes (default 0)")
    sim.add_argument("--fail-on-attempt", type=int, default=0,
                     help="crash only on this attempt (counted from 0, the first run; default 0)")
    sim.add_argument("--fail-code", type=int, default=3, help="exit code of the crash (default 3)")
    sim.add_argument("--checkpoint-every", type=int, default=None, help="rank 0 checkpoints every N steps")
    args = parser.parse_args(argv)
    if args.duration < 0 or args.step_seconds <= 0:
        parser.error("--duration must be >= 0 and --step-seconds > 0")
    return run_sim(args.duration, args.step_seconds, args.fail_at_step, args.fail_rank,
                   args.fail_on_attempt, args.fail_code, args.checkpoint_every)


if __name__ == "__main__":
    sys.exit(main())
