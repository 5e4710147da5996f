"""Wakes log followers when something is appended: LISTEN/NOTIFY, with polling as the fallback.

Why: followers (the outbox relay, projections) should see a new event within milliseconds without
hammering the database. Every append NOTIFYs channel `corral_events` in its transaction (delivered at
commit). One LISTEN connection per store serves all followers. NOTIFY is best effort (a dropped
listener connection misses some), so a follower also re-reads after `poll_interval` regardless.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

CHANNEL = "corral_events"
_RECONNECT_DELAY = 5.0


class AppendWakeups:
    """Hands out an `asyncio.Event` that is set by the next append notification.

    Usage avoids lost wakeups: `arm()` first, then read the log, and only if nothing was new
    `wait()` on the armed event: a notification that arrives during the read is not missed.
    """

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn: Any = None
        self._event = asyncio.Event()
        self._lock = asyncio.Lock()
        self._next_attempt = 0.0
        self._closed = False

    async def arm(self) -> asyncio.Event:
        await self._ensure_listening()
        return self._event

    async def wait(self, armed: asyncio.Event, timeout: float) -> None:
        """Return when `armed` fires or after `timeout` seconds (the polling fallback)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(armed.wait(), timeout)

    async def close(self) -> None:
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            with contextlib.suppress(Exception):
                await conn.close(timeout=2)
        self._wake()

    def _wake(self, *_: object) -> None:
        fired, self._event = self._event, asyncio.Event()
        fired.set()

    async def _ensure_listening(self) -> None:
        if self._closed or (self._conn is not None and not self._conn.is_closed()):
            return
        loop = asyncio.get_running_loop()
        if loop.time() < self._next_attempt:
            return
        async with self._lock:
            if self._conn is not None and not self._conn.is_closed():
                return
            import asyncpg

            try:
                conn = await asyncpg.connect(self._dsn)
                await conn.add_listener(CHANNEL, self._wake)
            except (OSError, asyncpg.PostgresError, TimeoutError):
                # Polling keeps followers correct meanwhile; retry the listener later.
                self._next_attempt = loop.time() + _RECONNECT_DELAY
                return
            conn.add_termination_listener(self._wake)
            self._conn = conn
