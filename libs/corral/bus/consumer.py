"""The pull loop of one durable JetStream consumer: fetch, hand to the handler, settle each message.

Settling rules (explicit ack, one message at a time, so per-subject order is kept):
- handler returns        -> ack
- handler raises Retry or any unexpected exception
                         -> nak with a delay from the backoff list (or Retry.delay)
- handler raises Poison, or fails on delivery number `max_deliver`
                         -> publish to `<ns>.dlq.<durable>` (original data and headers plus where
                            it came from and why), then term
- delivery number > `max_deliver` (the consumer died while handling it last time, so the handler
  never returned) -> dead-letter without calling the handler again.

Why the server's delivery limit is `max_deliver + 1`: if the server stopped at `max_deliver` and
the process crashed during that last delivery, the message would silently never be seen again.
Why the backoff is applied by nak delay and not by the consumer's `backoff` setting: the server
overrides `ack_wait` with the first backoff value, so a handler slower than that would see its
message redelivered while still working on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import nats.errors

from corral.bus.delivery import (
    Delivery,
    Handler,
    Poison,
    Retry,
    dead_letter_headers,
    dead_letter_msg_id,
    retry_delay,
)

log = logging.getLogger(__name__)

BatchHandler = Callable[[list[Delivery]], Awaitable[Sequence[BaseException | None]]]
"""Handles a whole fetched batch; returns one outcome per delivery, in order: None to ack, the
exception (`Retry`, `Poison` or any other) to settle it as a single handler raising it would."""

DeadLetter = Callable[[Delivery, str], Awaitable[None]]
"""Publishes `delivery` to the dead-letter subject with the error text."""

_FETCH_TIMEOUT = 5.0
_MIN_GATHER = 0.005
_ERROR_PAUSE = 0.5
_ACK_TIMEOUT = 5.0


def delivery_of(msg: Any) -> Delivery:
    """Our view of a nats-py JetStream message."""
    meta = msg.metadata
    return Delivery(
        subject=msg.subject,
        data=bytes(msg.data),
        headers=dict(msg.headers or {}),
        delivery_count=int(meta.num_delivered),
        stream=meta.stream,
        stream_sequence=int(meta.sequence.stream),
        consumer_sequence=int(meta.sequence.consumer),
        timestamp=meta.timestamp,
    )


class RunningConsumer:
    """A durable pull consumer processing messages in a task. `await stop()` ends it cleanly:
    the message being handled is finished and settled, fetched but unhandled ones are nak'ed."""

    def __init__(self, subscription: Any, durable: str, handler: Handler, dead_letter: DeadLetter, *,
                 max_deliver: int, backoff: Sequence[float], batch: int, linger: float = 0.0,
                 batch_handler: BatchHandler | None = None) -> None:
        self.durable = durable
        self._sub = subscription
        self._handler = handler
        self._dead_letter = dead_letter
        self._max_deliver = max_deliver
        self._backoff = tuple(backoff)
        self._batch = batch
        self._linger = linger
        self._batch_handler = batch_handler
        self._stopping = False
        self._fetching = False
        self.task: asyncio.Task[None] = asyncio.create_task(self._run(), name=f"consumer:{durable}")

    async def stop(self) -> None:
        self._stopping = True
        if self._fetching and not self.task.done():
            self.task.cancel()  # idle in a long poll: nothing to finish
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    async def __aenter__(self) -> RunningConsumer:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    async def _run(self) -> None:
        try:
            while not self._stopping:
                try:
                    self._fetching = True
                    msgs = await self._fetch()
                except (nats.errors.TimeoutError, TimeoutError):
                    continue
                except asyncio.CancelledError:
                    if self._stopping:
                        return
                    raise
                except Exception:
                    log.exception("consumer %s: fetch failed; retrying", self.durable)
                    await asyncio.sleep(_ERROR_PAUSE)
                    continue
                finally:
                    self._fetching = False
                fetched = len(msgs)
                if self._batch_handler is not None and not self._stopping:
                    await self._settle_batch(msgs)
                    msgs = []
                for index, msg in enumerate(msgs):
                    if self._stopping:
                        for unhandled in msgs[index:]:
                            with contextlib.suppress(Exception):
                                await unhandled.nak()
                        break
                    await self._settle(msg, confirm=index == len(msgs) - 1)
                if self._linger > 0 and fetched < self._batch and not self._stopping:
                    # A partial batch means we are keeping up: let the next one gather for a moment
                    # (one fetch round trip, one confirmed ack, one handler pass per batch instead
                    # of per trickle of messages; under load batches fill and no time is lost).
                    await asyncio.sleep(self._linger)
        finally:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    async def _fetch(self) -> list[Any]:
        """What is there (up to `batch`), else what arrives within a short gathering window, else
        block until the next message.

        Why not one `fetch(batch, timeout=5)`: once its pull request has to wait on the server,
        nats-py returns only when the batch is FULL or the timeout expires, so a consumer that
        had caught up handled its next messages up to 5 s late (or after `batch` of them).
        """
        try:
            return list(await self._sub.fetch(self._batch, timeout=max(self._linger, _MIN_GATHER)))
        except (nats.errors.TimeoutError, TimeoutError):
            pass
        return list(await self._sub.fetch(1, timeout=_FETCH_TIMEOUT))

    async def _settle(self, msg: Any, confirm: bool = True) -> None:
        delivery = await self._delivery(msg)
        if delivery is None:
            return
        try:
            if delivery.delivery_count > self._max_deliver:
                await self._give_up(msg, delivery, f"delivery limit {self._max_deliver} exceeded: the "
                                                   "consumer stopped while handling it last time")
                return
            outcome: BaseException | None = None
            try:
                await self._handler(delivery)
            except Exception as exc:
                outcome = exc
            await self._finish(msg, delivery, outcome, confirm)
        except Exception:
            # Settling failed (connection lost?): the server redelivers after ack_wait.
            log.exception("consumer %s: could not settle message %s", self.durable,
                          delivery.stream_sequence)

    async def _settle_batch(self, msgs: Sequence[Any]) -> None:
        """Hand every message of a fetch to the batch handler at once, then settle each by its
        outcome (same rules as one at a time; the last ack of the batch is confirmed)."""
        assert self._batch_handler is not None
        todo: list[tuple[Any, Delivery]] = []
        for msg in msgs:
            delivery = await self._delivery(msg)
            if delivery is None:
                continue
            if delivery.delivery_count > self._max_deliver:
                try:
                    await self._give_up(msg, delivery, f"delivery limit {self._max_deliver} exceeded: the "
                                                       "consumer stopped while handling it last time")
                except Exception:
                    log.exception("consumer %s: could not settle message %s", self.durable,
                                  delivery.stream_sequence)
                continue
            todo.append((msg, delivery))
        if not todo:
            return
        try:
            outcomes: Sequence[BaseException | None] = await self._batch_handler([d for _, d in todo])
            if len(outcomes) != len(todo):
                raise RuntimeError(f"batch handler returned {len(outcomes)} outcomes for {len(todo)} messages")
        except Exception as exc:
            outcomes = [exc] * len(todo)
        for index, ((msg, delivery), outcome) in enumerate(zip(todo, outcomes, strict=True)):
            try:
                await self._finish(msg, delivery, outcome, confirm=index == len(todo) - 1)
            except Exception:
                log.exception("consumer %s: could not settle message %s", self.durable,
                              delivery.stream_sequence)

    async def _delivery(self, msg: Any) -> Delivery | None:
        try:
            return delivery_of(msg)
        except Exception:
            log.exception("consumer %s: not a JetStream message; terminating it", self.durable)
            with contextlib.suppress(Exception):
                await msg.term()
            return None

    async def _finish(self, msg: Any, delivery: Delivery, outcome: BaseException | None, confirm: bool) -> None:
        """Settle one handled message: ack on success, nak with a delay to retry, dead-letter."""
        if isinstance(outcome, Poison):
            await self._give_up(msg, delivery, f"poison: {outcome}")
            return
        if outcome is not None:
            exc = outcome
            reason = str(exc) if isinstance(exc, Retry) else (
                f"{type(exc).__name__}: {exc}\n{''.join(traceback.format_exception(exc, limit=5))}")
            if delivery.delivery_count >= self._max_deliver:
                await self._give_up(msg, delivery, f"failed {delivery.delivery_count} times; "
                                                   f"last: {reason}")
                return
            delay = exc.delay if isinstance(exc, Retry) and exc.delay is not None else (
                retry_delay(self._backoff, delivery.delivery_count))
            if not isinstance(exc, Retry):
                log.warning("consumer %s: handler failed on %s (delivery %d), retrying in %.1fs: %s",
                            self.durable, delivery.subject, delivery.delivery_count, delay, reason)
            await msg.nak(delay=delay)
            return
        # Wait for the server to confirm the last ack of a batch (and any ack while stopping):
        # the server handles one connection's acks in order, so that confirms the earlier ones
        # too, and once `stop()` returns nothing handled comes back. One round trip per batch
        # instead of per message: that round trip was most of a busy consumer's time.
        if confirm or self._stopping:
            await msg.ack_sync(timeout=_ACK_TIMEOUT)
        else:
            await msg.ack()

    async def _give_up(self, msg: Any, delivery: Delivery, error: str) -> None:
        log.error("consumer %s: dead-lettering %s seq %d: %s", self.durable, delivery.subject,
                  delivery.stream_sequence, error)
        await self._dead_letter(delivery, error)
        await msg.term()


def dead_letter_publisher(publish: Callable[[str, bytes, str, dict[str, str]], Awaitable[object]],
                          subject: str, durable: str) -> DeadLetter:
    """A `DeadLetter` that publishes to `subject` through `publish(subject, data, msg_id, headers)`."""

    async def dead_letter(delivery: Delivery, error: str) -> None:
        await publish(subject, delivery.data, dead_letter_msg_id(delivery, durable),
                      dead_letter_headers(delivery, durable, error))

    return dead_letter
