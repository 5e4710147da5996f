"""`/readyz` says whether a service's view is the log's truth yet.

A standby waiting for its lease is not ready; once it takes over it folds the whole log, and is
not ready while it does (held here at its rebuild); it is ready once it consumes. `/healthz` is
200 all along: the process is alive.
"""

from __future__ import annotations

import asyncio
import time
from typing import ClassVar

import pytest

from corral.health import probe_url
from corral.services.base import Service
from corral.services.run_loop import run_service
from corral.services.settings import Settings
from corral.stack.servers import free_port
from tests.metrics_text import get, parse, readyz


class Gated(Service):
    """A single-writer service whose rebuild waits for `gate` (the test's hook into a long rebuild)."""

    name: ClassVar[str] = "gated"
    lease: ClassVar[str | None] = "gated"
    gate: ClassVar[asyncio.Event | None] = None

    async def rebuild(self) -> None:
        gate = type(self).gate
        if gate is not None:
            await gate.wait()
        await super().rebuild()


class Expect:
    """A /readyz answer expected at `url`: its status and some of its fields."""

    def __init__(self, url: str, status: int, **fields: object) -> None:
        self.url, self.status, self.fields = url, status, fields

    def met(self, status: int, body: dict[str, object]) -> bool:
        return status == self.status and all(body.get(k) == v for k, v in self.fields.items())


async def until(expect: Expect, timeout: float = 20.0) -> dict[str, object]:
    """The /readyz body once it is as expected."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            status, body = await asyncio.to_thread(readyz, expect.url)
        except OSError:
            status, body = 0, {}
        if expect.met(status, body):
            return body
        assert time.monotonic() < deadline, f"/readyz stayed {status} {body}"
        await asyncio.sleep(0.1)


async def test_readyz_is_false_on_a_standby_and_while_rebuilding_and_true_after(
        nats_url: str, postgres_dsn: str, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(nats_url=nats_url, postgres_dsn=postgres_dsn, namespace=namespace)
    first_url, second_url = (f"http://127.0.0.1:{free_port()}" for _ in range(2))
    stop_first, stop_second = asyncio.Event(), asyncio.Event()
    monkeypatch.setenv("CORRAL_METRICS_ADDR", first_url.removeprefix("http://"))
    first = asyncio.create_task(run_service(Gated, settings, stop=stop_first))
    second: asyncio.Task[None] | None = None
    try:
        await until(Expect(first_url, 200, ready=True, phase="consuming"))
        Gated.gate = asyncio.Event()
        monkeypatch.setenv("CORRAL_METRICS_ADDR", second_url.removeprefix("http://"))
        second = asyncio.create_task(run_service(Gated, settings, stop=stop_second))
        body = await until(Expect(second_url, 503, ready=False, phase="standby"))
        assert body["lease"] == {"name": "gated", "held": False}
        assert (await asyncio.to_thread(get, second_url + "/healthz"))[0] == 200
        # what compose's healthcheck (`corral healthcheck --url`) asks: alive, not ready
        assert (await asyncio.to_thread(probe_url, second_url + "/healthz"))[0] is True
        assert (await asyncio.to_thread(probe_url, second_url + "/readyz"))[0] is False

        stop_first.set()  # the holder goes: the standby takes over and rebuilds (held at the gate)
        await asyncio.wait_for(first, 10)
        body = await until(Expect(second_url, 503, ready=False, phase="rebuilding"))
        assert body["lease"] == {"name": "gated", "held": True} and body["rebuilt"] is False
        page = parse((await asyncio.to_thread(get, second_url + "/metrics"))[1])
        assert page.values("corral_service_phase", service="gated", phase="rebuilding") == [1.0]
        assert (await asyncio.to_thread(get, second_url + "/healthz"))[0] == 200

        Gated.gate.set()
        body = await until(Expect(second_url, 200, ready=True, phase="consuming"))
        assert body["caught_up"] is True and body["nats"] is True
    finally:
        Gated.gate = None
        stop_first.set()
        stop_second.set()
        await asyncio.gather(first, *([second] if second else []), return_exceptions=True)
