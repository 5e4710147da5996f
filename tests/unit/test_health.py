"""The health file behind `corral healthcheck` (issue 15, item 4)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from corral.health import beat, fresh


def test_fresh_only_when_touched_within_max_age(tmp_path: Path) -> None:
    f = tmp_path / "health"
    assert not fresh(f, 30)
    f.touch()
    os.utime(f, (1000.0, 1000.0))
    assert fresh(f, 30, now=1029.0) and not fresh(f, 30, now=1031.0)


async def test_beat_touches_only_while_connected(tmp_path: Path) -> None:
    f, connected = tmp_path / "d" / "health", [False]
    task = asyncio.create_task(beat(f, lambda: connected[0], interval=0.01))
    await asyncio.sleep(0.05)
    assert not f.exists()
    connected[0] = True
    await asyncio.sleep(0.05)
    task.cancel()
    assert fresh(f, 5)
