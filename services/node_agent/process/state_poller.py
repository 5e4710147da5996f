"""One timer for every gang's state file: wake a gang's watcher when its file changed, or at its deadline.

Why: each gang's watcher looks at its stepd's `state.json` every poll interval (a stat), and a
task woken per gang per look costs the agent a timer and a task step each time, though the file
changes a few times in a gang's life. Here one task per event loop and interval stats every
watched file per tick and wakes only the watchers whose file changed (inode, mtime, size) or
whose deadline passed (the watcher's own checks: is the stepd alive, commands to write again).
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass

from .step_files import file_version


@dataclass(eq=False, slots=True)
class _Waiter:
    path: str
    seen: tuple[int, int, int] | None
    deadline: float
    woken: asyncio.Future[None]


class StatePoller:
    """Stats the files watchers wait on every `interval` seconds, in one task (while any waits)."""

    _shared: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, StatePoller]] = (
        weakref.WeakKeyDictionary())

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._waiters: list[_Waiter] = []
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def shared(cls, interval: float) -> StatePoller:
        """The poller of the running loop for `interval` (every supervisor of a process shares it)."""
        pollers = cls._shared.setdefault(asyncio.get_running_loop(), {})
        poller = pollers.get(interval)
        if poller is None:
            poller = pollers[interval] = cls(interval)
        return poller

    async def wait(self, path: str, seen: tuple[int, int, int] | None, timeout: float) -> None:
        """Return once `path`'s version is not `seen`, or after about `timeout` seconds."""
        loop = asyncio.get_running_loop()
        waiter = _Waiter(path, seen, loop.time() + timeout, loop.create_future())
        self._waiters.append(waiter)
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="stepd-state-poller")
        await waiter.woken  # cancelled: the tick drops it (its future is done)

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
                    if now >= w.deadline or file_version(w.path) != w.seen:
                        w.woken.set_result(None)
                    else:
                        kept.append(w)
                self._waiters = kept
        finally:
            self._task = None  # holds the loop: a poller whose loop is gone must not keep it
