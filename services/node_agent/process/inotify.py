"""Linux inotify on folders, through ctypes: which watched folder had which file written or made.

Why: the agent follows every live gang's `state.json`; looking at each file on a timer costs a
stat per gang per look, and a change waits for the next look. The kernel says when a file in a
watched folder is written, made or renamed into it (`DirWatch.read`), and the agent looks then.
Where inotify is missing (not Linux, no libc symbol, the watch limit reached) `open` / `add`
return None and the caller looks on its timer.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
from dataclasses import dataclass

IN_MODIFY = 0x00000002
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_EXCL_UNLINK = 0x04000000

#: a file in the folder written, made (a hard link too) or renamed into it
FILE_CHANGES = IN_MODIFY | IN_CREATE | IN_MOVED_TO

_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name, NUL-padded)


@dataclass(frozen=True, slots=True)
class Change:
    wd: int
    mask: int
    name: bytes


class DirWatch:
    """One inotify instance (a non-blocking descriptor to read when it is readable)."""

    def __init__(self, fd: int, libc: ctypes.CDLL) -> None:
        self.fd = fd
        self._libc = libc

    @classmethod
    def open(cls) -> DirWatch | None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            init = libc.inotify_init1
        except (OSError, AttributeError):
            return None
        fd = init(os.O_NONBLOCK | os.O_CLOEXEC)
        return cls(fd, libc) if fd >= 0 else None

    def add(self, folder: str) -> int | None:
        """Watch `folder` for FILE_CHANGES: its watch descriptor, or None (missing, no room)."""
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(folder), FILE_CHANGES | IN_ONLYDIR | IN_EXCL_UNLINK)
        return wd if wd >= 0 else None

    def remove(self, wd: int) -> None:
        self._libc.inotify_rm_watch(self.fd, wd)

    def read(self) -> list[Change]:
        """The changes the kernel has queued (none when nothing is)."""
        changes: list[Change] = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except (BlockingIOError, InterruptedError):
                return changes
            if not data:
                return changes
            at = 0
            while at + _EVENT.size <= len(data):
                wd, mask, _, size = _EVENT.unpack_from(data, at)
                name = data[at + _EVENT.size:at + _EVENT.size + size].rstrip(b"\0")
                changes.append(Change(wd, mask, name))
                at += _EVENT.size + size

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
