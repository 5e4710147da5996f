"""`python -m corral.services.gateway` (`corral service gateway`): the local gateway until SIGTERM.

Needs CORRAL_NATS_URL, CORRAL_POSTGRES_DSN (a read login), CORRAL_NATS_CREDENTIALS (the
`gateway` identity) and CORRAL_GATEWAY (the socket's path; default /run/corral-gateway/gateway.sock).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from pathlib import Path

from corral import environment
from corral.bus import Bus
from corral.bus.urls import addresses
from corral.eventstore import EventStore
from corral.gateway.protocol import DEFAULT_SOCKET, SOCKET_ENV
from corral.health import start_beat
from corral.services.gateway.service import Gateway
from corral.services.settings import Settings
from corral.services.waiting import when_up
from corral.stack.credentials import CREDENTIALS_ENV
from corral.telemetry import endpoint, logs
from corral.telemetry.endpoint import METRICS_ADDR_ENV

log = logging.getLogger("corral.gateway")
NAME = "gateway"


async def run(settings: Settings, path: str, stop: asyncio.Event) -> None:
    store = await when_up(NAME, "Postgres", lambda: EventStore.open(settings.postgres_dsn, pool_size=8, min_size=1),
                          stop)
    if store is None:
        return
    bus = await when_up(NAME, "NATS", lambda: Bus.connect(settings.nats_url, settings.namespace, name=NAME), stop,
                        where=addresses(settings.nats_url))
    if bus is None:
        await store.close()
        return
    gateway = Gateway(bus, store, settings.namespace, msg_key=_secret())
    server = await gateway.listen(path)

    async def healthz() -> tuple[int, str, bytes]:
        return 200, "text/plain", b"ok\n"

    async def readyz() -> tuple[int, str, bytes]:
        up = bool(bus.nc.is_connected)
        return (200 if up else 503), "application/json", json.dumps({"ready": up, "nats": up}).encode()

    async def metrics() -> tuple[int, str, bytes]:
        return 200, "text/plain; version=0.0.4", gateway.metrics_text()

    telemetry = await endpoint.start(environment.get(METRICS_ADDR_ENV),
                                     {"/healthz": healthz, "/readyz": readyz, "/metrics": metrics}, NAME)
    beat = start_beat(lambda: bool(bus.nc.is_connected))
    try:
        await stop.wait()
    finally:
        server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        if beat is not None:
            beat.cancel()
        if telemetry is not None:
            await telemetry.close()
        await bus.close()
        await store.close()
        log.info("gateway: stopped")


def _secret() -> bytes | None:
    """The gateway's credentials file (its NATS password in it): what keys its message ids."""
    path = environment.get(CREDENTIALS_ENV)
    try:
        return Path(path).read_bytes() if path else None
    except OSError:
        return None


def main() -> None:
    logs.configure(NAME)
    settings = Settings.from_env()
    path = environment.get(SOCKET_ENV) or DEFAULT_SOCKET

    async def _main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(settings, path, stop)

    asyncio.run(_main())


if __name__ == "__main__":
    main()
