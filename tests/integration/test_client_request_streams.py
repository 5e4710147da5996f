"""A request finds the bus's streams missing (it raced the services' start): it declares them and
is stored, once.

Why: `Client.connect` declares no stream (each is a round trip); a request publishes at once and
declares the streams only when its inbox stream is missing, so a submission that races the
services' start is still stored.
"""

from __future__ import annotations

import nats.js.errors
import pytest

from corral.bus import Bus
from corral.bus.naming import INBOX
from corral.client import Client
from corral.contracts.jobspec import validate_job_spec
from corral.stack.context import Context


async def test_a_request_before_any_stream_declares_them_and_is_stored(nats_url: str, namespace: str) -> None:
    bus = await Bus.connect(nats_url, namespace=namespace)
    try:
        inbox = bus.names.stream(INBOX)
        with pytest.raises(nats.js.errors.NotFoundError):
            await bus.js.stream_info(inbox)
        ctx = Context(nats_url=nats_url, postgres_dsn="postgresql://unused", namespace=namespace)
        client = Client(ctx, store=None, bus=bus)  # type: ignore[arg-type]  (a request reads no log)
        spec = validate_job_spec({"name": "early", "queue": "q", "runtime": "sim", "duration_seconds": 1})
        await client.submit(spec, user="early")
        await client.submit(spec, user="early")
        assert (await bus.js.stream_info(inbox)).state.messages == 2
    finally:
        await bus.close()
