"""A child memory cgroup of this test's own, to OOM-kill one process of a stack on purpose.

cgroup v2 (`memory.max`, `memory.events`' oom_kill) or v1 (`memory.limit_in_bytes`,
`memory.oom_control`' oom_kill), whichever this process's memory controller is; `why_not()` says
why none can be made here (not root, no controller, read-only), for the test's skip reason.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def _own() -> tuple[Path, int] | None:
    """This process's memory cgroup folder and its version, or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            for base in (ROOT / "memory", ROOT):
                folder = base / path.lstrip("/")
                if (folder / "memory.limit_in_bytes").exists():
                    return folder, 1
    for line in lines:
        if line.startswith("0::"):
            path = line.split(":", 2)[2].lstrip("/")
            for base in (ROOT, ROOT / "unified"):
                folder = base / path
                if (base / "cgroup.controllers").exists() and "memory" in (base / "cgroup.controllers").read_text():
                    return folder, 2
    return None


@dataclass
class MemoryCgroup:
    folder: Path
    version: int

    @classmethod
    def make(cls, name: str, limit_bytes: int) -> MemoryCgroup:
        found = _own()
        assert found is not None, why_not()
        parent, version = found
        folder = parent / name
        folder.mkdir()
        cgroup = cls(folder, version)
        if version == 2:
            (folder / "memory.max").write_text(str(limit_bytes))
            with contextlib.suppress(OSError):
                (folder / "memory.swap.max").write_text("0")
        else:
            (folder / "memory.limit_in_bytes").write_text(str(limit_bytes))
            with contextlib.suppress(OSError):
                (folder / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
        return cgroup

    def move(self, pid: int) -> None:
        """Put `pid` in this cgroup: what it allocates from now on counts against the limit."""
        (self.folder / "cgroup.procs").write_text(str(pid))

    def oom_kills(self) -> int:
        text = (self.folder / ("memory.events" if self.version == 2 else "memory.oom_control")).read_text()
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def remove(self) -> None:
        """Move what is left in it (a process the test did not see killed) back to the parent, and
        remove it."""
        with contextlib.suppress(OSError):
            for pid in (self.folder / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (self.folder.parent / "cgroup.procs").write_text(pid)
            self.folder.rmdir()


def why_not() -> str | None:
    """Why no memory cgroup can be made here, or None when one can."""
    if os.geteuid() != 0:
        return "making a memory cgroup needs root"
    found = _own()
    if found is None:
        return "no memory cgroup controller (cgroup v1 memory or v2 with memory) for this process"
    folder, _ = found
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        return f"this process's memory cgroup {folder} is not writable"
    return None
