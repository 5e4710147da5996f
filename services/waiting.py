"""Waiting for a dependency at start: Postgres or NATS, tried again until it answers or a stop.

Why: a process started while Postgres or NATS is down (a restart of either, hosts coming up in
another order, node agents started before the control plane) waits for it: exiting would have
whatever supervises it restart it every half second, a traceback each time. An unavailable
dependency (`is_unavailable`) is not a reason to exit, nor is a database not created yet (a
server that answers before its bootstrap has made it); anything else still is. A try that hangs
(NATS's client retries its first connection by itself) is interrupted by the stop, so a process
waiting for its dependency still stops when told, and it says once what it is waiting for.
Used by every service's run loop (`corral.services.run_loop`) and by the node agents.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from corral.bus import UnavailableBackoff, is_unavailable

log = logging.getLogger("corral.service")

T = TypeVar("T")

#: Short tries, so a process answers soon after its dependency comes up.
START_BACKOFF = UnavailableBackoff(first=0.25, cap=2.0)
#: A try still under way this long is worth a line saying what the process waits for.
PATIENCE = 5.0


async def when_up(who: str, what: str, connect: Callable[[], Awaitable[T]], stop: asyncio.Event, *,
                  where: str = "") -> T | None:
    """`connect()`, tried again while `what` does not answer; None if `stop` is set first (a try
    under way is then cancelled: `connect` must release what it holds on cancellation).

    `who` names the process in its log lines, `where` says where `what` is looked for."""
    failures = 0
    said = False
    patience = PATIENCE
    at = f" at {where}" if where else ""
    while not stop.is_set():
        attempt: asyncio.Task[T] = asyncio.ensure_future(connect())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            done, _ = await asyncio.wait({attempt, stopped}, timeout=None if said else patience,
                                         return_when=asyncio.FIRST_COMPLETED)
            if not done:
                said = True
                log.warning("%s: waiting for %s%s (not up after %gs; trying on)", who, what, at, patience)
                await asyncio.wait({attempt, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not attempt.done():
                attempt.cancel()
                with contextlib.suppress(BaseException):
                    await attempt
        if attempt.cancelled():
            return None
        exc = attempt.exception()
        if exc is None:
            if said or failures:
                log.info("%s: %s%s answers", who, what, at)
            return attempt.result()
        if not (is_unavailable(exc) or isinstance(exc, asyncpg.exceptions.InvalidCatalogNameError)):
            raise exc
        failures += 1
        delay = START_BACKOFF.delay(failures)
        log.warning("%s: %s%s does not answer (%s: %s); trying again in %.2fs", who, what, at,
                    type(exc).__name__, exc, delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
    return None
