"""The worker log files of one job, and nothing else: what `corral logs JOB` may print.

Why: `corral logs ../../x` or `corral logs /any/dir` printed every `rank-*.log` there, following
symlinks (it printed /etc/shadow as root). Here the argument must be a job id (the contract's
pattern: no '/', no leading dot, so no path), the job's directory must resolve inside the log
directory, and a log file is read only if it is a regular file, not a symlink, inside that
directory (opened with O_NOFOLLOW, so a swap between the check and the read fails too).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # contracts.events.JobId


@dataclass(frozen=True)
class LogsRefused:
    """Why no logs are read: the message names the argument and the fix."""

    message: str


def check_job_id(job: str) -> LogsRefused | None:
    """Why `job` is not a job id (so never a path), or None."""
    if not _JOB_ID.match(job) or ".." in job:
        return LogsRefused(f"{job!r} is not a job id (letters, digits, '.', '_', '-'; no path): "
                           "give the id `corral jobs` shows")
    return None


def job_log_files(log_dir: Path, job: str, rank: int | None = None) -> list[Path] | LogsRefused:
    """The job's `rank-<n>.log` files under `log_dir/workers/<job>` (or `log_dir/<job>`)."""
    refused = check_job_id(job)
    if refused is not None:
        return refused
    root = log_dir.resolve()
    for base in (log_dir / "workers" / job, log_dir / job):
        if base.is_symlink() or not base.is_dir():
            continue
        real = base.resolve()
        if not real.is_relative_to(root):
            return LogsRefused(f"the log directory of job {job} leads out of {root}: refused")
        files = [f for f in sorted(base.glob("rank-*.log"))
                 if not f.is_symlink() and f.is_file() and f.resolve().parent == real]
        if rank is not None:
            files = [f for f in files if f.name == f"rank-{rank}.log"]
        return files
    return []


def read_log(path: Path) -> str:
    """A log file's text, refusing to follow a symlink put there after `job_log_files` looked."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        return f.read().decode(errors="replace")


def split_attempts(text: str, job: str) -> dict[int | None, list[str]]:
    """A rank file's lines by the attempt that wrote them: each attempt's part starts at the
    stepd's header line (`==== corral job <job> attempt <K> rank ...`); lines before any header
    (files of older agents) are under None."""
    head = f"==== corral job {job} attempt "
    parts: dict[int | None, list[str]] = {}
    current: int | None = None
    for line in text.splitlines():
        if line.startswith(head):
            number = line[len(head):].split(" ", 1)[0]
            current = int(number) if number.isdigit() else current
        parts.setdefault(current, []).append(line)
    return parts
