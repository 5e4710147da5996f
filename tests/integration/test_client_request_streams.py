"""A request finds the bus's streams missing (it raced the services' start): it declares them and
is stored, once.

Why: `Client.connect` declares no stream (each is a round trip); a request publishes at once and
declares the streams only when its inbox stream is missing, so a submission that races the
services' start is still stored.
"""

from __future__ import annotations

import nats.js.errors
import pytest

from corral.bus import Bus, request
from corral.bus.naming import INBOX
from corral.client import Client
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.registry import encode
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


async def test_a_lazy_client_publishes_without_nats_py_and_falls_back_to_the_bus(nats_url: str,
                                                                                 namespace: str) -> None:
    """A command's client (`lazy_bus`) publishes a request over a few lines of the protocol; with
    no stream yet (no ack) it publishes through the bus, which declares them; a retry with the
    same msg id is acked as a duplicate, stored once."""
    ctx = Context(nats_url=nats_url, postgres_dsn="postgresql://unused", namespace=namespace)
    client = Client(ctx, store=None, bus=None, lazy_bus=True)  # type: ignore[arg-type]  (a request reads no log)
    spec = validate_job_spec({"name": "lazy", "queue": "q", "runtime": "sim", "duration_seconds": 1})
    submitted = client.submission(spec, user="lazy")
    subject, data = client._request_subject(submitted), encode(submitted)
    with pytest.raises(request.NotPublished):  # no stream takes the subject yet
        await request.publish(nats_url, subject, data, {request.MSG_ID: submitted.event_id}, credentials=None,
                              ca=None, name="test")
    await client.publish_request(submitted)  # the bus path: declares the streams, publishes
    assert client._bus is not None
    bus = client._bus
    try:
        inbox = bus.names.stream(INBOX)
        again = await request.publish(nats_url, subject, data, {request.MSG_ID: submitted.event_id},
                                      credentials=None, ca=None, name="test")
        assert again.duplicate and again.stream == inbox
        other = client.submission(spec, user="lazy")
        fresh = Client(ctx, store=None, bus=None, lazy_bus=True)  # type: ignore[arg-type]
        await fresh.publish_request(other)
        assert fresh._bus is None, "published without nats-py"
        assert (await bus.js.stream_info(inbox)).state.messages == 2
    finally:
        await bus.close()
