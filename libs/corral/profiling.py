"""An opt-in whole-process profile of a service: `CORRAL_PROFILE_DIR=D` writes `D/<name>-<pid>.prof`
(cProfile, read with `python -m pstats`) when the process stops cleanly; SIGUSR1 writes the profile
so far as `D/<name>-<pid>-<n>.prof` and starts a new one (a window of a live stack: a signal before
and one after what is to be looked at). `CORRAL_PROFILE_ONLY=placement,quota` profiles only the
processes of those names (a profiler in every process slows a loaded stack into measuring itself).

Every thread the process starts inside the block is profiled too (quota decides its rounds in a
worker thread, `asyncio.to_thread`), each by its own CPU clock, and a file holds all of them: a
function's time is the CPU of the thread that ran it, not the process's while it ran.

Why: a live stack's CPU per job is spread over several processes (bench/e2e.py prints it by
process); finding where one of them spends it needs that process's own profile under the real
stream of events, and py-spy is not always at hand. Unset, this costs nothing.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from corral import environment

PROFILE_DIR_ENV = "CORRAL_PROFILE_DIR"
PROFILE_ONLY_ENV = "CORRAL_PROFILE_ONLY"


class _Taken:
    """A thread's profile so far, as `pstats.Stats` loads it (`create_stats` of a profile would
    stop it in the calling thread, not in its own)."""

    def __init__(self, profile: cProfile.Profile) -> None:
        profile.snapshot_stats()
        self.stats = profile.stats

    def create_stats(self) -> None:
        pass


@contextmanager
def profiled(name: str) -> Iterator[None]:
    """Profile the block when CORRAL_PROFILE_DIR is set; write the stats on leaving it."""
    folder = environment.get(PROFILE_DIR_ENV)
    only = environment.get(PROFILE_ONLY_ENV)
    if not folder:
        yield
        return
    if only and name not in only.split(","):
        # Left out of a profiled stack: a window's SIGUSR1, sent to every process of the stack,
        # is ignored here instead of ending the process (the signal's default).
        previous_handler = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        try:
            yield
        finally:
            signal.signal(signal.SIGUSR1, previous_handler)
        return
    main = cProfile.Profile(time.thread_time)  # CPU, not wall: the machine may be shared
    threads: list[cProfile.Profile] = []
    windows = 0

    def thread_started(*_: Any) -> None:
        """The first profile event of a new thread: it gets a profile of its own from here on."""
        profile = cProfile.Profile(time.thread_time)
        threads.append(profile)
        profile.enable()  # replaces this hook in this thread

    def dump(path: str) -> None:
        os.makedirs(folder, exist_ok=True)
        stats = pstats.Stats(cast(Any, _Taken(main)))
        for profile in list(threads):
            taken = _Taken(profile)
            if taken.stats:  # a thread that ran nothing in the window (pstats loads no empty profile)
                stats.add(cast(Any, taken))
        stats.dump_stats(path)

    def window(*_: object) -> None:
        nonlocal windows
        main.disable()
        windows += 1
        dump(os.path.join(folder, f"{name}-{os.getpid()}-{windows}.prof"))
        for profile in [main, *threads]:
            profile.clear()
        main.enable()

    previous = signal.signal(signal.SIGUSR1, window)
    threading.setprofile(thread_started)
    main.enable()
    try:
        yield
    finally:
        main.disable()
        threading.setprofile(None)
        signal.signal(signal.SIGUSR1, previous)
        dump(os.path.join(folder, f"{name}-{os.getpid()}.prof"))
