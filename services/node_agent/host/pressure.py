"""What a node agent measures of its node for its conditions (`corral.core.conditions`).

The folders it writes (the stepds' state, the rank logs, the checkpoints) and the memory the
kernel says is available (`MemAvailable`, what the kubelet's `memory.available` reads). The rule
(which measure is pressure) is the core's; this module only reads the machine.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from corral.core.conditions import Sample


def disk(folder: Path) -> tuple[int, int] | None:
    """(free bytes for an unprivileged writer, total bytes) of the filesystem holding `folder`, or
    of its nearest existing parent (a folder made on demand); None when nothing can be read."""
    for path in (folder, *folder.parents):
        try:
            st = os.statvfs(path)
        except OSError:
            continue
        return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    return None


def memory_available_mib(meminfo: Path = Path("/proc/meminfo")) -> float | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def sample(folders: Iterable[Path]) -> Sample:
    disks = {str(f): measured for f in folders if (measured := disk(f)) is not None}
    return Sample(disks, memory_available_mib())
