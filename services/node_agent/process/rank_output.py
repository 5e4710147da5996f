"""A rank's output, from its pipe to its log file, never failing the rank for the disk.

A rank whose stdout is its log file itself meets a full log folder on its next write: `print`
raises `OSError: [Errno 28]` and a healthy job crashes of the node's disk. So the stepd holds the
file and the rank writes into a pipe (as slurmstepd does): `RankOutput` appends what comes through
to `<log_dir>/<job>/rank-<N>.log`. What the disk refuses (full, or the file cannot be opened) is
dropped and counted; once a write succeeds again, a marker line says how much was lost and why,
before the output goes on. The rank never sees the disk.

Stdlib only: the stepd imports this.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable

READ_SIZE = 1 << 16
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})

#: Opens the log for appending (`stepd.open_log_fd` with the rank's user): a raw fd.
Opener = Callable[[], int]


class RankOutput:
    """One rank's log: `write` what the stepd says, `pump` what the rank printed."""

    def __init__(self, opener: Opener) -> None:
        self._open = opener
        self._fd: int | None = None
        self.pipe: int | None = None  # the read end of the rank's stdout and stderr
        self.dropped = 0  # bytes the disk refused since the last successful write
        self.why = ""

    def open(self) -> None:
        """Open the log now: a log that cannot be opened for another reason than a full disk (a
        folder in its place, a denied permission) is the rank's to fail on, before it starts."""
        try:
            self._fd = self._open()
        except OSError as exc:
            if exc.errno not in DISK_FULL:
                raise
            self.why = exc.strerror or "disk full"

    def attach(self, pipe: int) -> None:
        os.set_blocking(pipe, False)
        self.pipe = pipe

    def write(self, data: bytes) -> None:
        """Append `data`, or count it as dropped (after a marker once the disk takes writes again)."""
        if not data:
            return
        if self.dropped:
            marker = (f"==== corral: {self.dropped} bytes of output dropped: the log folder refused them "
                      f"({self.why}) ====\n").encode()
            if self._append(marker) < len(marker):
                self.dropped += len(data)
                return
            self.dropped = 0
        self.dropped += len(data) - self._append(data)

    def _append(self, data: bytes) -> int:
        """How much of `data` the log took (all of it but when the disk refuses: full, unopenable)."""
        done = 0
        try:
            if self._fd is None:
                self._fd = self._open()
            while done < len(data):
                done += os.write(self._fd, data[done:])
        except OSError as exc:
            self.why = exc.strerror or type(exc).__name__
        return done

    def pump(self, *, until_empty: bool = True) -> bool:
        """Copy what the pipe holds to the log; False once the pipe is closed (the rank and what it
        spawned are gone) or was never there."""
        if self.pipe is None:
            return False
        while True:
            try:
                chunk = os.read(self.pipe, READ_SIZE)
            except BlockingIOError:
                return True
            except OSError:
                chunk = b""
            if not chunk:
                self.close_pipe()
                return False
            self.write(chunk)
            if not until_empty:
                return True

    def close_pipe(self) -> None:
        if self.pipe is not None:
            with contextlib.suppress(OSError):
                os.close(self.pipe)
            self.pipe = None

    def close(self) -> None:
        self.close_pipe()
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
