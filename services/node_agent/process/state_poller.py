"""One timer for every gang's state file: wake a gang's watcher when its file changed, or at its deadline.

Why: each gang's watcher waits for its stepd's `state.json` to change, which it does a few times
in a gang's life, and for its own deadline (its checks: is the stepd alive, commands to write
again). A task woken per gang per look would cost a timer and a task step each time; here one
task per event loop and interval wakes the watchers whose deadline passed, and the kernel says
which files changed (`inotify`: a watch on each waited file's folder, read when the loop finds
it readable), so a change wakes its watcher at once and no file is looked at on the timer. A
file whose folder cannot be watched (no inotify, the watch limit reached, no folder yet) is
looked at (inode, mtime, size) at every tick instead.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from dataclasses import dataclass, field

from .inotify import IN_IGNORED, IN_Q_OVERFLOW, DirWatch
from .step_files import file_version


@dataclass(eq=False, slots=True)
class _Waiter:
    path: str
    seen: tuple[int, int, int] | None
    deadline: float
    woken: asyncio.Future[None]
    watched: bool  # its folder is watched: a change is told, not looked for


@dataclass(eq=False, slots=True)
class _Folder:
    wd: int
    name: bytes  # the file waited on in it
    waiters: list[_Waiter] = field(default_factory=list)
    changed: bool = True  # the file may have changed while no watcher waited: looked at on the next wait


class StatePoller:
    """Wakes watchers at their deadlines every `interval` seconds, in one task (while any waits),
    and at once when the file each waits on changes."""

    _shared: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, StatePoller]] = (
        weakref.WeakKeyDictionary())

    def __init__(self, interval: float, *, notify: bool = True) -> None:
        self.interval = interval
        self._waiters: list[_Waiter] = []
        self._task: asyncio.Task[None] | None = None
        self._watch: DirWatch | None = None
        self._notify = notify
        self._folders: dict[str, _Folder] = {}
        self._by_wd: dict[int, str] = {}

    @classmethod
    def shared(cls, interval: float) -> StatePoller:
        """The poller of the running loop for `interval` (every supervisor of a process shares it)."""
        pollers = cls._shared.setdefault(asyncio.get_running_loop(), {})
        poller = pollers.get(interval)
        if poller is None:
            poller = pollers[interval] = cls(interval)
        return poller

    def _watcher(self, loop: asyncio.AbstractEventLoop) -> DirWatch | None:
        if self._watch is None and self._notify:
            self._notify = False  # tried once
            self._watch = DirWatch.open()
            if self._watch is not None:
                loop.add_reader(self._watch.fd, self._on_changes)
                weakref.finalize(self, self._watch.close)  # the poller lives as long as its loop
        return self._watch

    def _folder(self, loop: asyncio.AbstractEventLoop, path: str) -> _Folder | None:
        folder, name = os.path.split(path)
        known = self._folders.get(folder)
        if known is not None:
            return known
        watch = self._watcher(loop)
        wd = watch.add(folder) if watch is not None else None
        if wd is None:
            return None
        known = self._folders[folder] = _Folder(wd, os.fsencode(name))
        self._by_wd[wd] = folder
        return known

    async def wait(self, path: str, seen: tuple[int, int, int] | None, timeout: float) -> None:
        """Return once `path`'s version is not `seen`, or after about `timeout` seconds."""
        loop = asyncio.get_running_loop()
        folder = self._folder(loop, path)
        if folder is not None and folder.changed:
            folder.changed = False
            if file_version(path) != seen:
                return
        waiter = _Waiter(path, seen, loop.time() + timeout, loop.create_future(), folder is not None)
        if folder is not None:  # those woken at their deadline go as the next one comes
            folder.waiters = [w for w in folder.waiters if not w.woken.done()]
            folder.waiters.append(waiter)
        self._waiters.append(waiter)
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="stepd-state-poller")
        await waiter.woken  # cancelled: the tick drops it (its future is done)

    def forget(self, path: str) -> None:
        """Nothing waits on `path` any more (its gang ended): its folder is no longer watched."""
        folder = self._folders.pop(os.path.dirname(path), None)
        if folder is not None:
            del self._by_wd[folder.wd]
            if self._watch is not None:
                self._watch.remove(folder.wd)

    def _on_changes(self) -> None:
        assert self._watch is not None
        for change in self._watch.read():
            if change.mask & IN_Q_OVERFLOW:  # changes were lost: every watched file may have changed
                for name in list(self._folders):
                    self._changed(name)
                continue
            path = self._by_wd.get(change.wd)
            if path is None:
                continue
            if change.mask & IN_IGNORED:  # the folder is gone (removed): nothing more comes from it
                del self._by_wd[change.wd]
                self._folders.pop(path, None)
                continue
            if change.name == self._folders[path].name:
                self._changed(path)

    def _changed(self, path: str) -> None:
        folder = self._folders[path]
        waiters, folder.waiters = folder.waiters, []
        woken = False
        for w in waiters:
            if not w.woken.done():
                w.woken.set_result(None)
                woken = True
        folder.changed = folder.changed or not woken

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._waiters:
                await asyncio.sleep(self.interval)
                now = loop.time()
                kept: list[_Waiter] = []
                for w in self._waiters:
                    if w.woken.done():
                        continue
                    if now >= w.deadline or (not w.watched and file_version(w.path) != w.seen):
                        w.woken.set_result(None)
                    else:
                        kept.append(w)
                self._waiters = kept
        finally:
            self._task = None  # holds the loop: a poller whose loop is gone must not keep it

