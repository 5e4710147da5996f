"""Unix socket paths longer than the kernel takes (`sun_path`: 108 bytes).

A data directory deep in a project (or a test's temporary folder) gives a socket path the
kernel refuses to bind or connect to. `bindable` hands out a path to the same file through
`/proc/self/fd/<folder>` for as long as it is needed, so the socket keeps its real name.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

#: The longest path `bind`/`connect` take as it is (sun_path, with its terminating NUL).
MAX_SUN_PATH = 107


@contextlib.contextmanager
def bindable(path: str) -> Iterator[str]:
    """`path`, or when it is too long for a unix socket address, the same file reached through an
    open descriptor of its folder (valid inside the `with`)."""
    if len(os.fsencode(path)) <= MAX_SUN_PATH:
        yield path
        return
    folder, name = os.path.split(os.path.abspath(path))
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        short = f"/proc/self/fd/{fd}/{name}"
        if len(os.fsencode(short)) > MAX_SUN_PATH:
            raise OSError(f"socket name {name!r} is too long for a unix socket")
        yield short
    finally:
        os.close(fd)
