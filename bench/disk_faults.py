"""A full disk on one folder, exactly: a small tmpfs mounted on it, filled with a file, freed.

Root only (mount); `can_mount` says why not elsewhere. Used by `bench/chaos.py --disk-full`;
`tests/e2e/test_disk_full.py` uses it for each folder of a stack.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path


def can_mount() -> str | None:
    """Why a tmpfs cannot be mounted here (None: it can)."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    probe = Path(f"/tmp/corral-tmpfs-probe-{os.getpid()}")
    probe.mkdir(exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            return f"mount -t tmpfs failed: {done.stderr.strip()}"
        subprocess.run(["umount", str(probe)], check=False)
        return None
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


def mount(path: Path, size: str, *, owner: tuple[int, int] | None = None, mode: str = "0755") -> Path:
    """`path` (created) as a tmpfs of `size` ("16m", "1g"), owned by `owner` (uid, gid)."""
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size},mode={mode}" + (f",uid={owner[0]},gid={owner[1]}" if owner else "")
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)
    return path


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def fill(folder: Path, name: str = "filler", byte: bytes = b"\0") -> Path:
    """Append to `folder/name` until its filesystem has no space left; the file's path."""
    filler = folder / name
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 20, 1 << 12, 1):  # down to the last byte
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, byte * size)
    finally:
        os.close(fd)
    return filler
