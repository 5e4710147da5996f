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
    # Backends of earlier tests on this database may still be exiting: only new ones count.
    earlier = await _backends(postgres_dsn, 0.1)
    loop = relay_forever(None, None, settings, service) if which == "relay" else \
        project_forever(None, settings, service)
    task = asyncio.create_task(loop)
    try:
        seen = await _backends(postgres_dsn, 1.3) - {holder._conn.get_server_pid()} - earlier
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await holder.release()
    assert len(seen) == 1, f"{len(seen)} sessions opened by one waiting process in 1.3 s"


class _Work:
    """Leased work that fails its first `fails` runs with `error`, then runs until stopped."""

    def __init__(self, fails: int, error: Exception) -> None:
        self.fails, self.error, self.starts, self.stops = fails, error, 0, 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        if self.starts <= self.fails:
            raise self.error
        await asyncio.Event().wait()

    def start(self) -> asyncio.Task[None]:
        self.starts += 1
        self._task = asyncio.create_task(self._run())
        return self._task

    async def stop(self) -> None:
        self.stops += 1
        task, self._task = self._task, None
        if task is None:
            return
        if task.done():
            task.result()
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_the_relay_and_projector_loop_retries_or_ends_as_told(postgres_dsn: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """One loop for both (`corral.services.leased_task`): a failure the caller calls fatal ends it
    (the relay, on a bug); any other is retried with the lease given back (the projector); a stop
    stops the work and frees the lease for the next process."""
    import corral.services.leased_task as leased

    monkeypatch.setattr(asyncio, "sleep", _fast(asyncio.sleep))
    service: Any = _Waiting()

    work = _Work(fails=1, error=RuntimeError("a bug"))
    with pytest.raises(RuntimeError, match="a bug"):
        await asyncio.wait_for(leased.run_while_leased(Lease(postgres_dsn, "corral:t:fatal"), service, work,
                                                       name="relay lease", doing="relaying",
                                                       fatal=lambda exc: True), 30)
    after = Lease(postgres_dsn, "corral:t:fatal")
    assert await after.try_acquire(), "the lease was not given back"
    await after.release()

    work = _Work(fails=2, error=RuntimeError("a bug"))
    lease = Lease(postgres_dsn, "corral:t:retry")
    loop = asyncio.create_task(leased.run_while_leased(lease, service, work, name="projector", doing="projecting",
                                                       fatal=lambda exc: False))
    try:
        for _ in range(600):
            if work.starts >= 3:
                break
            await asyncio.sleep(0.05)
        assert work.starts == 3 and not loop.done()  # two failures retried; the third run lasts
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
    assert work._task is None, "the work outlived the loop"
    other = Lease(postgres_dsn, "corral:t:retry")
    assert await other.try_acquire(), "the lease was not given back on stop"
    await other.release()


def _fast(sleep: Any) -> Any:
    """asyncio.sleep capped at 50 ms: the loop's backoff (0.5 s, then more) in test time."""
    async def short(delay: float, *args: Any) -> Any:
        return await sleep(min(delay, 0.05), *args)
    return short
