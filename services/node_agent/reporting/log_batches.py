"""Log chunks of many ranks published together: one pipelined publish (`Bus.publish_many`) for
what the ranks hand over within a few milliseconds of each other.

Why: the ranks of a node's gangs end in step (one state poller wakes them), and each rank's chunk
alone is a JetStream request awaiting its own ack; together they leave in one write and their acks
come back on one subscription. A batch is all or nothing to its caller: when it fails, each rank
publishes its own chunks alone (`LogShipper`), so a chunk the bus refuses holds up the others of
its batch once, for that batch's publish, and then only its own rank. Batches do not wait for one
another: one stuck on a refused chunk keeps no later chunk waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence

from corral.bus import Outgoing

#: Publish the messages in order and wait for every ack; raises when any did not land.
PublishMany = Callable[[Sequence[Outgoing]], Awaitable[object]]

#: How long the first chunk handed over waits for others to join its batch (seconds).
WINDOW = 0.005
#: At most this many messages in one batch.
MOST = 256


class ChunkBatches:
    """Collects each rank's chunks (in its order) for a batch, publishes them together, and tells
    each rank whether its own chunks landed (`publish` returns, or raises the batch's error)."""

    def __init__(self, publish_many: PublishMany, *, window: float = WINDOW, most: int = MOST) -> None:
        self._publish_many = publish_many
        self._window = window
        self._most = most
        self._queued: list[tuple[list[Outgoing], asyncio.Future[None]]] = []
        self._count = 0  # messages queued
        self._timer: asyncio.TimerHandle | None = None
        self._flushes: set[asyncio.Task[None]] = set()

    async def publish(self, messages: list[Outgoing]) -> None:
        """Publish `messages` (one rank's, in order) within the next batch; raises if it failed."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._queued.append((messages, done))
        self._count += len(messages)
        if self._count >= self._most:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self._window, self._flush)
        await done

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        queued = [(m, f) for m, f in self._queued if not f.done()]  # a rank stopped meanwhile drops out
        self._queued, self._count = [], 0
        if queued:
            task = asyncio.get_running_loop().create_task(self._send(queued), name="log-chunk-batch")
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)

    async def _send(self, queued: list[tuple[list[Outgoing], asyncio.Future[None]]]) -> None:
        try:
            await self._publish_many([m for messages, _ in queued for m in messages])
        except asyncio.CancelledError:
            for _, done in queued:
                done.cancel()
            raise
        except Exception as exc:  # each rank publishes its own chunks alone
            for _, done in queued:
                if not done.done():
                    done.set_exception(exc)
        else:
            for _, done in queued:
                if not done.done():
                    done.set_result(None)

    async def close(self) -> None:
        """Stop the batches in flight (their ranks' cursors stay before their chunks)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for _, done in self._queued:
            done.cancel()
        self._queued, self._count = [], 0
        tasks = list(self._flushes)
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
