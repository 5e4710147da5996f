"""An opt-in whole-process profile of a service: `CORRAL_PROFILE_DIR=D` writes `D/<name>-<pid>.prof`
(cProfile, read with `python -m pstats`) when the process stops cleanly; SIGUSR1 writes the profile
so far as `D/<name>-<pid>-<n>.prof` and starts a new one (a window of a live stack: a signal before
and one after what is to be looked at). `CORRAL_PROFILE_ONLY=placement,quota` profiles only the
processes of those names (a profiler in every process slows a loaded stack into measuring itself).

Why: a live stack's CPU per job is spread over several processes (bench/e2e.py prints it by
process); finding where one of them spends it needs that process's own profile under the real
stream of events, and py-spy is not always at hand. Unset, this costs nothing.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

from corral import environment

PROFILE_DIR_ENV = "CORRAL_PROFILE_DIR"
PROFILE_ONLY_ENV = "CORRAL_PROFILE_ONLY"


@contextmanager
def profiled(name: str) -> Iterator[None]:
    """Profile the block when CORRAL_PROFILE_DIR is set; write the stats on leaving it."""
    folder = environment.get(PROFILE_DIR_ENV)
    only = environment.get(PROFILE_ONLY_ENV)
    if not folder or (only and name not in only.split(",")):
        yield
        return
    import cProfile

    profile = cProfile.Profile(time.process_time)  # CPU, not wall: the machine may be shared
    windows = 0

    def window(*_: object) -> None:
        nonlocal windows
        profile.disable()
        windows += 1
        os.makedirs(folder, exist_ok=True)
        profile.dump_stats(os.path.join(folder, f"{name}-{os.getpid()}-{windows}.prof"))
        profile.clear()
        profile.enable()

    previous = signal.signal(signal.SIGUSR1, window)
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        signal.signal(signal.SIGUSR1, previous)
        os.makedirs(folder, exist_ok=True)
        profile.dump_stats(os.path.join(folder, f"{name}-{os.getpid()}.prof"))
