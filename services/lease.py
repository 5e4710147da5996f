"""The single-writer lease: a Postgres session advisory lock held while its connection lives.

Why: placement must have exactly one active writer, and the outbox relay one publisher,
even when the holder is killed with -9. A session advisory lock is freed by the server when the
holder's socket closes, so a standby that blocks on it takes over without any timeout of ours.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from typing import Any

import asyncpg

from corral.bus import dependency_failure

_log = logging.getLogger("corral.service")


class Lease:
    """A Postgres session advisory lock: held while the connection lives, freed when the holder dies
    (even by kill -9, when the server notices the closed socket). One writer per resource."""

    def __init__(self, dsn: str, name: str) -> None:
        self.dsn = dsn
        self.name = name
        self.key = zlib.crc32(name.encode()) & 0x7FFFFFFF
        self._conn: Any = None

    async def try_acquire(self) -> bool:
        if self._conn is None or self._conn.is_closed():
            self._conn = await asyncpg.connect(self.dsn)
        got = bool(await self._conn.fetchval("SELECT pg_try_advisory_lock($1)", self.key))
        return got

    async def acquire(self, poll: float = 0.5) -> None:
        """Wait until the lock is ours. Postgres unavailable meanwhile is waited out, never raised:
        a standby whose wait raised was taken for the holder (the run loop did not look at how
        the wait ended) and started deciding beside the real one."""
        while not await self.try_acquire_or_wait():
            await asyncio.sleep(poll)

    async def try_acquire_or_wait(self) -> bool:
        """`try_acquire`, False (with the broken connection dropped) while Postgres is unavailable."""
        try:
            return await self.try_acquire()
        except Exception as exc:
            if not dependency_failure(exc):
                raise
            _log.warning("lease %s: Postgres unavailable (%s: %s); waiting", self.name, type(exc).__name__, exc)
            await self.release()
            return False

    async def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            try:
                await conn.close(timeout=2.0)
            except Exception:  # the server is gone: drop the socket
                conn.terminate()

    async def alive(self) -> bool:
        """Still ours? A lost database connection means the lease may be someone else's now."""
        if self._conn is None or self._conn.is_closed():
            return False
        try:
            await self._conn.fetchval("SELECT 1")
            return True
        except Exception as exc:
            if dependency_failure(exc):
                return False
            raise


