"""A service started while Postgres (or NATS) is down waits for it, and starts when it comes up.

Why: a service that exits with a traceback when Postgres does not answer at its start is started
again by whatever supervises it, every half second, each time a traceback in its log. An
unavailable dependency is waited out; the service is up as soon as the dependency is. (NATS's
client retries its first connection; its test keeps it so.) Real servers: each starts on the port
the service has been trying, after the service started.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import ClassVar

import pytest

from corral.bus.auth import nats_authorization, superuser
from corral.services.base import Service
from corral.services.run_loop import run_service
from corral.services.settings import Settings
from corral.stack import credentials
from corral.stack.servers import NatsServer, PostgresServer


class Counting(Service):
    name: ClassVar[str] = "waiting-counting"
    tick_seconds: ClassVar[float] = 30.0
    reconciles: ClassVar[int] = 0

    async def reconcile(self) -> None:
        type(self).reconciles += 1


async def first_reconcile(task: asyncio.Task[None], what: str) -> None:
    """Until the service's first reconcile: it started once `what` came up."""
    deadline = time.monotonic() + 30
    while Counting.reconciles == 0:
        assert not task.done() and time.monotonic() < deadline, f"the service did not start once {what} was up"
        await asyncio.sleep(0.05)


async def retried(caplog: pytest.LogCaptureFixture, task: asyncio.Task[None], what: str) -> None:
    """Until the service has said twice that `what` does not answer (it is waiting, not gone)."""
    deadline = time.monotonic() + 30
    while sum(f"{what} does not answer" in r.getMessage() for r in caplog.records) < 2:
        assert not task.done(), f"the service did not wait for {what}: {task.exception()!r}"
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    assert not task.done()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_service_started_before_nats_waits_for_it_and_then_runs(postgres_dsn: str, namespace: str) -> None:
    port, password = free_port(), secrets.token_urlsafe(16)
    url = f"nats://corral-test:{password}@127.0.0.1:{port}"
    stop = asyncio.Event()
    task = asyncio.create_task(run_service(Counting, Settings(nats_url=url, postgres_dsn=postgres_dsn,
                                                              namespace=namespace), stop=stop))
    data = Path(tempfile.mkdtemp(prefix="corral-test-nats-"))
    server = None
    try:
        # NATS's client retries its first connection itself and says nothing we could wait on: a
        # second of trying is the only sign of waiting there is.
        await asyncio.sleep(1.0)
        assert not task.done(), f"the service did not wait for NATS: {task.exception()!r}"
        assert Counting.reconciles == 0
        server = NatsServer(data, port=port,
                            authorization=nats_authorization([superuser("corral-test", password)])).start()
        await first_reconcile(task, "NATS")
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        if server is not None:
            server.stop()
        shutil.rmtree(data, ignore_errors=True)


async def test_a_service_waiting_for_postgres_stops_when_told(nats_url: str, namespace: str,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    dsn = f"postgresql://corral:x@127.0.0.1:{free_port()}/corral"
    stop = asyncio.Event()
    task = asyncio.create_task(run_service(Counting, Settings(nats_url=nats_url, postgres_dsn=dsn,
                                                              namespace=namespace), stop=stop))
    await retried(caplog, task, "Postgres")
    asked = time.monotonic()
    stop.set()
    await asyncio.wait_for(task, 10)
    assert time.monotonic() - asked < 2.0


async def test_a_service_started_before_postgres_waits_for_it_and_then_runs(
        nats_url: str, namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    port, password = free_port(), secrets.token_urlsafe(16)
    data = Path(tempfile.mkdtemp(prefix="corral-test-pg-"))
    credentials.write_pgpass(data / "credentials" / "pg-superuser.pgpass", "postgres", password)  # its login, known now
    server = PostgresServer(data, port=port, password=password)
    dsn = server.dsn
    stop = asyncio.Event()
    Counting.reconciles = 0
    task = asyncio.create_task(run_service(Counting, Settings(nats_url=nats_url, postgres_dsn=dsn,
                                                              namespace=namespace), stop=stop))
    try:
        await retried(caplog, task, "Postgres")
        await asyncio.to_thread(server.start)
        assert server.dsn == dsn
        await first_reconcile(task, "Postgres")
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        server.stop()
        shutil.rmtree(data, ignore_errors=True)
