"""A consumer says when it has caught up: the time before which every message was handled.

Why: placement takes a node's heartbeats that stopped listing a gang for its workers lost, but
the gang's exit reports may wait in placement's inbox behind a backlog (a starved machine, 900
reports behind): that silence proves nothing past the time up to which the inbox is read
(`corral.lifecycle.Gang.reports_read_at`). The subscription is a stand-in; nothing else is faked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import nats.errors

from corral.bus.consumer import RunningConsumer
from corral.bus.delivery import Delivery
from tests.unit.test_bus_consumer_backlog import _dead_letter, _ignore
from tests.unit.test_bus_consumer_backlog import _Message as _Unreplied
from tests.unit.test_bus_consumer_backlog import _Subscription as _Backlog


class _Message(_Unreplied):
    reply = None  # nats-py reads the metadata then


class _Subscription(_Backlog):
    """Serves `backlog` messages, `served` a fetch, then times out (nothing more was published)."""

    message = _Message

    def __init__(self, backlog: int, served: int) -> None:
        super().__init__(backlog, served)
        self.empty_fetches = 0

    async def fetch(self, batch: int, timeout: float) -> list[_Unreplied]:
        await asyncio.sleep(0)
        if self.left == 0:
            self.empty_fetches += 1
            raise nats.errors.TimeoutError
        return self.serve(batch)


async def test_caught_up_only_once_nothing_waits_and_at_a_time_before_that_fetch() -> None:
    subscription = _Subscription(backlog=100, served=30)
    ticks = iter(range(1, 10_000))
    handled: list[int] = []
    said: list[tuple[float, int]] = []  # (time said, messages handled by then)

    async def handle(deliveries: Sequence[Delivery]) -> list[BaseException | None]:
        handled.extend(d.stream_sequence for d in deliveries)
        return [None] * len(deliveries)

    sub: Any = subscription
    consumer = RunningConsumer(sub, "placement-inbox", _ignore, _dead_letter, max_deliver=5, backoff=(1.0,),
                               batch=64, linger=0.0, batch_handler=handle)
    consumer.clock = lambda: float(next(ticks))
    consumer.caught_up = lambda at: said.append((at, len(handled)))
    for _ in range(200):
        if subscription.empty_fetches >= 2:
            break
        await asyncio.sleep(0)
    await consumer.stop()
    assert said, "never said it caught up"
    # Never while the server said more waited: the first time is after the last of the 100.
    assert said[0][1] == 100
    # The time is the one read before the fetch that left nothing waiting (the 4th: 30, 30, 30, 10).
    assert said[0][0] == 4.0
    # Afterwards each empty fetch says so again, at the time before it.
    assert [at for at, _ in said] == sorted(at for at, _ in said)
