"""A service told to stop (SIGTERM, Ctrl-C of `corral up`) stops at once and decides nothing more.

Why: a service loop that waits for a change or its tick (1 s) before it looks at `stop`, then runs
one more reconcile, makes every stop take up to a tick, and placement could still place a job after
`corral up` has begun to shut down (the deciders stop first so that nothing is decided while the
system goes down).
"""

from __future__ import annotations

import asyncio
import time
from typing import ClassVar

from corral.services.base import Service
from corral.services.run_loop import run_service
from corral.services.settings import Settings


class Counting(Service):
    """A service that only counts its reconciles; its tick is long, so only `stop` can end a wait."""

    name: ClassVar[str] = "counting"
    tick_seconds: ClassVar[float] = 30.0
    reconciles: ClassVar[int] = 0

    async def reconcile(self) -> None:
        type(self).reconciles += 1


async def test_a_stopped_service_returns_at_once_without_another_reconcile(
        nats_url: str, postgres_dsn: str, namespace: str) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(run_service(Counting, Settings(nats_url=nats_url, postgres_dsn=postgres_dsn,
                                                              namespace=namespace), stop=stop))
    deadline = time.monotonic() + 30
    while Counting.reconciles == 0:  # the first reconcile follows the start
        assert not task.done() and time.monotonic() < deadline
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)  # idle now: waiting for a change or the 30 s tick
    before = Counting.reconciles
    asked = time.monotonic()
    stop.set()
    await asyncio.wait_for(task, 10)
    assert time.monotonic() - asked < 2.0, "the stop waited for the tick"
    assert Counting.reconciles == before, "a reconcile ran after the stop"


async def test_a_stopped_service_leaves_no_relay_task_behind(
        nats_url: str, postgres_dsn: str, namespace: str) -> None:
    """The relay lease's task was cancelled at a stop, but the relay it had started kept running:
    with its store's pool closed it logged 'pool is closed; retrying' forever, in every later test
    of the same process (the CI log of test_workers_lost shows them)."""
    stop = asyncio.Event()
    before = {t for t in asyncio.all_tasks() if not t.done()}
    task = asyncio.create_task(run_service(Counting, Settings(nats_url=nats_url, postgres_dsn=postgres_dsn,
                                                              namespace=namespace), stop=stop))
    deadline = time.monotonic() + 30
    while not any(t.get_name() == "relay:relay" for t in asyncio.all_tasks()):  # this process relays
        assert not task.done() and time.monotonic() < deadline
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, 10)
    left = {t for t in asyncio.all_tasks() if not t.done()} - before - {asyncio.current_task()}
    assert not left, f"still running after the stop: {sorted(t.get_name() for t in left)}"
