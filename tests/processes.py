"""Processes as `/proc` shows them, for tests that kill an agent or a stepd and watch what outlives it.

The node agents, their stepds and the ranks share the test's pid space (network namespaces do not
separate pids), so a pid a `WorkerStarted` names can be looked up here from any host.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (a rank whose stepd has not reaped it yet)."""
    try:
        return b") Z " not in Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False


async def exited(pids: Iterable[int], timeout: float = 20.0) -> None:
    """Returns once none of `pids` is alive; fails naming the ones still running after `timeout`."""
    pids = list(pids)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while running := [pid for pid in pids if alive(pid)]:
        if loop.time() > deadline:
            raise AssertionError(f"still running after {timeout} s: {running}")
        await asyncio.sleep(0.05)
