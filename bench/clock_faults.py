"""A node whose clock is off: one node agent (and every process it forks) run under libfaketime
with a fixed offset from the real clock.

libfaketime (Debian's `libfaketime`; `make test-deps` installs it as root) is preloaded with
`FAKETIME=+300` style offsets. The monotonic clock moves by the same fixed offset, which no
process can tell from the real one (only differences of it are ever used):
`FAKETIME_DONT_FAKE_MONOTONIC=1` would keep it real, but libfaketime 0.9.10 then fails every
`time.sleep` with EINVAL. An offset is set when the process starts; a clock stepping while it
runs is a restart with another offset. `why_not` says why it cannot be used here.

Used by `bench/chaos.py --clock-offset` and `tests/e2e/test_clock_offset.py`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

LIBRARIES = (Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"),
             Path("/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1"),
             Path("/usr/lib/faketime/libfaketime.so.1"))


def library() -> Path | None:
    return next((p for p in LIBRARIES if p.is_file()), None)


def env(offset_seconds: float) -> dict[str, str]:
    """The environment that puts a process's clocks `offset_seconds` off the real ones."""
    lib = library()
    if lib is None:
        raise RuntimeError(why_not() or "libfaketime is not installed")
    return {"LD_PRELOAD": str(lib), "FAKETIME": f"{offset_seconds:+.0f}"}


def why_not() -> str | None:
    """Why a process cannot be given an offset clock here (None: it can)."""
    if library() is None:
        return "libfaketime is not installed (`make test-deps` installs it as root: apt-get install libfaketime)"
    probe = subprocess.run([sys.executable, "-c", "import time; a = time.time(); time.sleep(0.01); print(a)"],
                           env={**os.environ, **env(3600)}, capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"a process under libfaketime fails here: {probe.stderr.strip()[-200:]}"
    if abs(float(probe.stdout) - time.time() - 3600) > 60:
        return "libfaketime is preloaded but does not move the clock here"
    return None
