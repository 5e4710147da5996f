"""The single-writer lease on a real Postgres: held by one, and Postgres down is waited out.

The review found that a standby whose lease wait raised (Postgres gone meanwhile) was taken for
the holder: the run loop never looked at how the wait ended, and the standby started deciding.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from corral.services.lease import Lease


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_one_holder_at_a_time_and_the_next_takes_over_when_it_lets_go(postgres_dsn: str) -> None:
    first, second = Lease(postgres_dsn, "corral:test:lease"), Lease(postgres_dsn, "corral:test:lease")
    try:
        assert await first.try_acquire()
        assert not await second.try_acquire_or_wait()
        waiting = asyncio.create_task(second.acquire(poll=0.05))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await first.release()
        await asyncio.wait_for(waiting, 10)
        assert await second.alive()
    finally:
        await first.release()
        await second.release()


async def test_postgres_unavailable_is_waited_out_not_raised() -> None:
    lease = Lease(f"postgresql://nobody@127.0.0.1:{_closed_port()}/none", "corral:test:down")
    assert not await lease.try_acquire_or_wait()
    with pytest.raises(TimeoutError):  # still waiting, not failed
        await asyncio.wait_for(lease.acquire(poll=0.05), 1.0)
    await lease.release()
