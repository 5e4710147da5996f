"""A consumer goes on fetching after settling a batch failed: it never ends while its service runs.

Why: the consumer's task is all that feeds its service. An acknowledgement that times out (the
consumer's leader lost with its server, while JetStream elects another) must not end that
task: an ended task keeps its exception to itself, and the service runs on, consuming nothing and
logging nothing. Here the batch's last message is retried (nak), so the acknowledgements of the ones
before it are sent after the batch, and the server does not answer the confirmed one.
The subscription is a stand-in serving fixed batches; nothing else is faked.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from types import SimpleNamespace

import nats.errors
import pytest

from corral.bus.consumer import RunningConsumer
from corral.bus.delivery import Delivery, Retry
from corral.bus.unavailable import UnavailableBackoff


class _Message:
    def __init__(self, sequence: int) -> None:
        self.subject, self.data = "corral.events.JobAdmitted", str(sequence).encode()
        self.headers: dict[str, str] = {}
        self.reply = ""
        self.metadata = SimpleNamespace(num_delivered=1, stream="CORRAL_EVENTS", num_pending=0,
                                        sequence=SimpleNamespace(stream=sequence, consumer=sequence),
                                        timestamp=datetime.now(UTC))
        self.settled: list[str] = []

    async def ack(self) -> None:
        self.settled.append("ack")

    async def ack_sync(self, timeout: float) -> None:
        raise nats.errors.TimeoutError  # the consumer's leader is gone: no answer

    async def nak(self, delay: float | None = None) -> None:
        self.settled.append("nak")


class _Subscription:
    def __init__(self, batches: list[list[_Message]]) -> None:
        self.batches = batches

    async def fetch(self, batch: int, timeout: float) -> list[_Message]:
        if not self.batches:
            await asyncio.sleep(timeout)
            raise nats.errors.TimeoutError
        return self.batches.pop(0)

    async def unsubscribe(self) -> None: ...


async def test_a_failed_acknowledgement_after_a_batch_does_not_end_the_consumer(
        caplog: pytest.LogCaptureFixture) -> None:
    first = [_Message(1), _Message(2)]
    later = _Message(3)
    handled: list[bytes] = []

    async def handler(delivery: Delivery) -> None:
        handled.append(delivery.data)
        if delivery.data == b"2":
            raise Retry("not yet", delay=1.0)

    async def dead_letter(delivery: Delivery, error: str) -> None:
        raise AssertionError(f"nothing is dead-lettered here: {error}")

    consumer = RunningConsumer(_Subscription([first, [later]]), "survivor", handler, dead_letter, max_deliver=5,
                               backoff=(1.0,), batch=16, unavailable_backoff=UnavailableBackoff(first=0.01, cap=0.01))
    try:
        async with asyncio.timeout(5):
            while b"3" not in handled:
                assert not consumer.task.done(), f"the consumer ended: {consumer.task.exception()!r}"
                await asyncio.sleep(0.01)
        assert not consumer.task.done()
        assert first[1].settled == ["nak"]
        assert any("settling a fetched batch failed" in r.getMessage() and r.levelno == logging.WARNING
                   for r in caplog.records), "the failure is said, as a dependency's (a timeout)"
    finally:
        await consumer.stop()
