"""Node agents started before NATS, or before the services declared the streams, wait for them.

Why: hosts come up in any order; an agent that exits when NATS does not answer is restarted by its
supervisor over and over, a traceback each time, and one that waits deaf to SIGTERM can only be
killed. The agents wait as the services do (`corral.services.waiting`): a line saying what they
wait for and where, the start going on once it answers, a stop obeyed at once meanwhile. Real
nats-servers, started on the port the agents have been trying.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.bus import Bus
from corral.bus.auth import agent, nats_authorization, superuser
from corral.bus.naming import durable_name
from corral.contracts.cluster import parse_cluster_shorthand
from corral.services import waiting
from corral.services.node_agent.service import AgentHost, AgentOptions, run_agents
from corral.stack.servers import NatsServer

NODES = parse_cluster_shorthand("1x4:H100").inventories()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def data() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="corral-test-nats-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def patience(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(waiting, "PATIENCE", 0.5)
    caplog.set_level(logging.INFO)


async def said(caplog: pytest.LogCaptureFixture, task: asyncio.Task[None], text: str) -> None:
    """Until a log line contains `text`, the agents still running."""
    deadline = time.monotonic() + 30
    while not any(text in r.getMessage() for r in caplog.records):
        assert not task.done(), f"the agents did not wait: {task.exception()!r}"
        assert time.monotonic() < deadline, f"no line saying {text!r}"
        await asyncio.sleep(0.05)


def start(url: str, tmp_path: Path, stop: asyncio.Event, ready: asyncio.Event,
          credentials: Path | None = None) -> asyncio.Task[None]:
    def on_ready(_: AgentHost) -> None:
        ready.set()

    options = AgentOptions(work_dir=tmp_path / "nodes", runtime="sim-timer", heartbeat_seconds=0.2)
    return asyncio.create_task(run_agents(url, "corral-test-wait", NODES, options, stop, on_ready=on_ready,
                                          credentials=str(credentials) if credentials else None))


async def test_agents_started_before_nats_wait_for_it_and_then_run(
        tmp_path: Path, data: Path, caplog: pytest.LogCaptureFixture) -> None:
    port, password = free_port(), secrets.token_urlsafe(16)
    stop, ready = asyncio.Event(), asyncio.Event()
    task = start(f"nats://corral-test:{password}@127.0.0.1:{port}", tmp_path, stop, ready)
    server = None
    try:
        await said(caplog, task, f"node agents: waiting for NATS at 127.0.0.1:{port}")
        assert not ready.is_set()
        server = NatsServer(data, port=port, authorization=nats_authorization([superuser("corral-test", password)]))
        await asyncio.to_thread(server.start)
        await asyncio.wait_for(ready.wait(), 30)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        if server is not None:
            server.stop()


async def test_agents_waiting_for_nats_stop_when_told(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    stop, ready = asyncio.Event(), asyncio.Event()
    task = start(f"nats://corral-test:x@127.0.0.1:{free_port()}", tmp_path, stop, ready)
    await said(caplog, task, "node agents: waiting for NATS")
    asked = time.monotonic()
    stop.set()
    await asyncio.wait_for(task, 10)
    assert time.monotonic() - asked < 2.0
    assert not ready.is_set()


async def test_agents_wait_for_the_streams_the_services_declare(
        tmp_path: Path, data: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An agent's identity may not declare the streams: it waits until a service has."""
    ns, password = "corral-test-wait", secrets.token_urlsafe(16)
    durable = durable_name([n.node for n in NODES])
    identity = agent(ns, [n.node for n in NODES], durable, secrets.token_urlsafe(16))
    credentials = tmp_path / "agent.json"
    credentials.write_text(json.dumps({"user": identity.user, "password": identity.password, "role": "agent"}))
    server = NatsServer(data, authorization=nats_authorization([superuser("corral-test", password), identity]))
    await asyncio.to_thread(server.start)
    stop, ready = asyncio.Event(), asyncio.Event()
    task = start(f"nats://127.0.0.1:{server.port}", tmp_path, stop, ready, credentials)
    try:
        await said(caplog, task, "waiting up to 60s for the services to declare it")
        assert not ready.is_set()
        async with await Bus.connect(f"nats://corral-test:{password}@127.0.0.1:{server.port}", ns) as service:
            await service.ensure_streams()
        await asyncio.wait_for(ready.wait(), 30)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        server.stop()
