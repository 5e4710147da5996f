"""One `corral up` per data directory.

Why: a second `corral up` in the same folder started a second Postgres on the same cluster
directory, which refused with a log dump ("postmaster.pid already exists"), and would have put a
second nats-server on the same JetStream store. The first `corral up` holds an exclusive
`flock` on `<data>/up.lock` (which also records its pid) for as long as it runs; the kernel
drops the lock when the process dies, however it dies, so a stale file never blocks a restart.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import IO


class AlreadyRunning(RuntimeError):
    """Another `corral up` holds this data directory."""

    def __init__(self, data_dir: Path, pid: int | None) -> None:
        self.pid = pid
        super().__init__(f"Already running (pid {pid if pid is not None else 'unknown'}) on {data_dir}: "
                         "stop it with Ctrl-C in its terminal (or `kill -TERM` that pid) first")


class DataDirLock:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "up.lock"
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        """Hold the lock, or raise AlreadyRunning naming the holder's pid."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = self.path.open("a+")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            text = f.read().strip()
            f.close()
            raise AlreadyRunning(self.path.parent, int(text) if text.isdigit() else None) from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._file = f

    def release(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.truncate(0)
                fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None
