"""The single-writer lease on a real Postgres: held by one, and Postgres down is waited out.

The review found that a standby whose lease wait raised (Postgres gone meanwhile) was taken for
the holder: the run loop never looked at how the wait ended, and the standby started deciding.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

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


class _Waiting:
    """What the lease loops read of their service: a standby that competes at once."""

    name = "standby"

    def monotonic(self) -> float:
        return asyncio.get_running_loop().time()

    def relay_wait(self) -> float:
        return 0.0


async def _backends(dsn: str, seconds: float) -> set[int]:
    """The backend pids connected to the test's database over `seconds` (polled)."""
    import asyncpg

    seen: set[int] = set()
    conn = await asyncpg.connect(dsn)
    try:
        end = asyncio.get_running_loop().time() + seconds
        while asyncio.get_running_loop().time() < end:
            rows = await conn.fetch("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                                    "AND pid <> pg_backend_pid()")
            seen.update(int(r["pid"]) for r in rows)
            await asyncio.sleep(0.05)
    finally:
        await conn.close()
    return seen


@pytest.mark.parametrize("which", ["relay", "projector"])
async def test_a_process_waiting_for_a_lease_keeps_one_connection(postgres_dsn: str, which: str) -> None:
    """Every service process competes for the relay's and the projector's leases, every 0.5 s
    while another holds them. Each failed try closed its connection and the next opened a new
    one: ~8 Postgres sessions a second on a live stack (1,846 in a 4-minute benchmark), each a
    backend forked and authenticated for one `pg_try_advisory_lock`."""
    from corral.services.projector_lease import project_forever
    from corral.services.relay import relay_forever
    from corral.services.settings import Settings

    holder = Lease(postgres_dsn, f"corral:corral:{which}")
    assert await holder.try_acquire()
    settings = Settings(nats_url="nats://127.0.0.1:1", postgres_dsn=postgres_dsn)
    service: Any = _Waiting()
    loop = relay_forever(None, None, settings, service) if which == "relay" else \
        project_forever(None, settings, service)
    task = asyncio.create_task(loop)
    try:
        seen = await _backends(postgres_dsn, 1.3) - {holder._conn.get_server_pid()}
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await holder.release()
    assert len(seen) == 1, f"{len(seen)} sessions opened by one waiting process in 1.3 s"
