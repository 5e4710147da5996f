"""Liveness of a Corral process for container healthchecks and Kubernetes probes.

The problem: the services and node agents serve no HTTP, so docker-compose and Kubernetes could
only see that the process exists, not that its event loop still runs and it still reaches NATS
(a wedged loop or a process that lost every NATS server looked healthy forever). With
`CORRAL_HEALTH_FILE` set, the process touches that file every few seconds while its event loop
runs and its NATS connection is up (`beat`); `corral healthcheck --file F --max-age S` (the probe)
exits 0 only when F was touched within S seconds (`fresh`).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

HEALTH_FILE_ENV = "CORRAL_HEALTH_FILE"
BEAT_SECONDS = 5.0


async def beat(path: Path, connected: Callable[[], bool], interval: float = BEAT_SECONDS) -> None:
    """Touch `path` every `interval` seconds while `connected()`; runs until cancelled."""
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        if connected():
            path.touch()
        await asyncio.sleep(interval)


def start_beat(connected: Callable[[], bool]) -> asyncio.Task[None] | None:
    """The beat task when `CORRAL_HEALTH_FILE` is set, else None (nothing to do)."""
    where = os.environ.get(HEALTH_FILE_ENV)
    if not where:
        return None
    return asyncio.create_task(beat(Path(where), connected), name="health-beat")


def fresh(path: Path, max_age: float, now: float | None = None) -> bool:
    """Whether `path` was touched within `max_age` seconds."""
    try:
        touched = path.stat().st_mtime
    except OSError:
        return False
    return (time.time() if now is None else now) - touched <= max_age
