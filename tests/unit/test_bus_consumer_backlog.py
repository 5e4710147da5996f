"""A consumer that the server says is behind fetches with a window long enough to fill its batch.

Why (bench/README.md): nats-py stops collecting a batch when the fetch's window ends (the
consumer's linger, 10 ms for an inbox), and on a busy event loop the messages the server sent
arrive slower than that. Under a backlog of hundreds, a short window takes a part of a batch at a
time, then lingers as if it had caught up, and workers' reports reach placement late.
On a quiet bus (`corral.bus.pacing`) a consumer blocks for its next message with no window.
The subscription here is a stand-in that records each fetch's window; nothing else is faked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from corral.bus.consumer import _BEHIND_GATHER, _FETCH_TIMEOUT, _MIN_GATHER, RunningConsumer
from corral.bus.delivery import Delivery


class _Message:
    def __init__(self, sequence: int, pending: int) -> None:
        self.subject, self.data = "corral.inbox.WorkerExited", b"{}"
        self.headers: dict[str, str] = {}
        self.metadata = SimpleNamespace(num_delivered=1, stream="CORRAL_INBOX", num_pending=pending,
                                        sequence=SimpleNamespace(stream=sequence, consumer=sequence),
                                        timestamp=datetime.now(UTC))

    async def ack(self) -> None: ...

    async def ack_sync(self, timeout: float) -> None: ...


class _Subscription:
    """Serves `backlog` messages in fetches of at most `served` (a fetch cut short by its window)."""

    message: type[_Message] = _Message

    def __init__(self, backlog: int, served: int) -> None:
        self.left, self.served, self.sequence = backlog, served, 0
        self.windows: list[float] = []
        self.drained = asyncio.Event()

    async def fetch(self, batch: int, timeout: float) -> list[_Message]:
        self.windows.append(timeout)
        if self.left == 0:
            self.drained.set()
            await asyncio.Event().wait()  # nothing more is published: the fetch waits until cancelled
        return self.serve(batch)

    def serve(self, batch: int) -> list[_Message]:
        """The next fetch's messages: at most `batch` and `served`, each saying how many wait after it."""
        n = min(batch, self.served, self.left)
        self.left -= n
        messages = []
        for i in range(n):
            self.sequence += 1
            messages.append(self.message(self.sequence, pending=self.left + n - i - 1))
        return messages

    async def unsubscribe(self) -> None: ...


async def _ignore(delivery: Delivery) -> None: ...


async def _dead_letter(delivery: Delivery, error: str) -> None: ...


async def _all_handled(deliveries: Sequence[Delivery]) -> list[BaseException | None]:
    return [None] * len(deliveries)


async def _windows(backlog: int, served: int, paced: bool = True) -> list[float]:
    subscription = _Subscription(backlog, served)
    sub: Any = subscription
    consumer = RunningConsumer(sub, "placement-inbox", _ignore, _dead_letter, max_deliver=5, backoff=(1.0,),
                               batch=64, linger=0.01, paced=paced, batch_handler=_all_handled)
    await asyncio.wait_for(subscription.drained.wait(), 5)
    await consumer.stop()
    return subscription.windows


async def test_after_a_batch_the_server_says_is_not_the_last_the_next_fetch_may_take_long_enough_to_fill() -> None:
    windows = await _windows(backlog=100, served=30)  # 1 + 30, 30, 30, 9, then nothing
    # nothing known yet (a quiet bus): the next message at once, and what waits behind it
    assert windows[:2] == [_FETCH_TIMEOUT, _MIN_GATHER]
    assert windows[2:5] == [_BEHIND_GATHER] * 3  # more waited after each of the first three
    assert windows[5] == 0.01  # the last batch emptied the backlog: back to gathering (a stream)


async def test_a_consumer_that_caught_up_on_a_quiet_bus_blocks_for_the_next_message() -> None:
    # 1 + 4 (one commit's messages), then nothing: no window held open for what does not come
    windows = await _windows(backlog=5, served=64)
    assert windows == [_FETCH_TIMEOUT, _MIN_GATHER, _FETCH_TIMEOUT]


async def test_a_consumer_not_paced_keeps_its_gathering_window_on_a_quiet_bus() -> None:
    # an inbox: its batches are its commits
    windows = await _windows(backlog=5, served=64, paced=False)
    assert windows == [0.01, 0.01]
