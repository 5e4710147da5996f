"""The pull loop of one durable JetStream consumer: fetch, hand to the handler, settle each message.

Settling rules (explicit ack, one message at a time, so per-subject order is kept):
- handler returns        -> ack (a fetched batch's acks leave in one write, the last confirmed)
- handler fails because a dependency is unavailable (`corral.bus.unavailable.is_unavailable`:
  Postgres or NATS not answering, `Unavailable`)
                         -> never dead-lettered, never counted: the consumer stops fetching,
                            keeps the message (`in_progress`, so the server does not redeliver
                            it) and calls the handler again after 0.5 s, 1 s, 2 s ... 10 s until
                            it gets another outcome, then settles that as below
- handler raises Retry or any other unexpected exception
                         -> nak with a delay from the backoff list (or Retry.delay)
- handler raises Poison, or fails on delivery number `max_deliver`
                         -> publish to `<ns>.dlq.<STREAM>.<seq>` of the original message (its data
                            and headers plus where it came from, which consumer, and why), then term
- delivery number > `max_deliver` (the consumer died while handling it last time, so the handler
  never returned) -> dead-letter without calling the handler again.

Why the server has no delivery limit (max_deliver -1) and the limit is kept here: the server
drops a message past its limit silently (an advisory nobody reads). Here every message past the
limit is dead-lettered with the reason, and a message held through an outage does not grow its
delivery count at all (it is never nak'ed while the dependency is down).
Why the backoff is applied by nak delay and not by the consumer's `backoff` setting: the server
overrides `ack_wait` with the first backoff value, so a handler slower than that would see its
message redelivered while still working on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import nats.errors

from corral.bus.client import ack_many
from corral.bus.delivery import (
    Delivery,
    Handler,
    Poison,
    Retry,
    dead_letter_headers,
    dead_letter_msg_id,
    retry_delay,
)
from corral.bus.pacing import Linger
from corral.bus.unavailable import UnavailableBackoff, is_unavailable
from corral.telemetry import logs, tracing

log = logging.getLogger(__name__)

BatchHandler = Callable[[list[Delivery]], Awaitable[Sequence[BaseException | None]]]
"""Handles a whole fetched batch; returns one outcome per delivery, in order: None to ack, the
exception (`Retry`, `Poison` or any other) to settle it as a single handler raising it would."""

DeadLetter = Callable[[Delivery, str], Awaitable[None]]
"""Publishes `delivery` to the dead-letter subject with the error text."""

_FETCH_TIMEOUT = 5.0
_MIN_GATHER = 0.005
#: How long a fetch may take to fill its batch when the server said more messages wait (see
#: `RunningConsumer._behind`): the batch fills at once, so this is only a cap.
_BEHIND_GATHER = 0.25
_ACK_TIMEOUT = 5.0


def delivery_of(msg: Any) -> Delivery:
    """Our view of a nats-py JetStream message.

    The reply subject of the server's classic form (`$JS.ACK.<stream>.<consumer>.<delivered>.
    <stream seq>.<consumer seq>.<ns since epoch>.<pending>`) is read here in one split: nats-py's
    `Msg.metadata` builds three objects for it, a fifth of what a service spends per event
    delivered; any other form is read by nats-py."""
    reply = msg.reply
    tokens: list[str] = reply.split(".") if reply else []
    if len(tokens) == 9 and tokens[0] == "$JS" and tokens[1] == "ACK":
        return Delivery(
            subject=msg.subject,
            data=bytes(msg.data),
            headers=dict(msg.headers or {}),
            delivery_count=int(tokens[4]),
            stream=tokens[2],
            stream_sequence=int(tokens[5]),
            consumer_sequence=int(tokens[6]),
            timestamp=datetime.fromtimestamp(int(tokens[7]) / 1_000_000_000.0, UTC),
        )
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


def _more_waiting(msgs: Sequence[Any]) -> bool:
    """Whether the server had more messages for this consumer after the last of `msgs`."""
    if not msgs:
        return False
    try:
        return int(msgs[-1].metadata.num_pending or 0) > 0
    except Exception:  # not a JetStream message: `_delivery` terminates it
        return False


class RunningConsumer:
    """A durable pull consumer processing messages in a task. `await stop()` ends it cleanly:
    the message being handled is finished and settled, fetched but unhandled ones are nak'ed."""

    def __init__(self, subscription: Any, durable: str, handler: Handler, dead_letter: DeadLetter, *,
                 max_deliver: int, backoff: Sequence[float], batch: int, linger: float = 0.0, paced: bool = True,
                 batch_handler: BatchHandler | None = None,
                 unavailable_backoff: UnavailableBackoff | None = None) -> None:
        self.durable = durable
        self._sub = subscription
        self._handler = handler
        self._dead_letter = dead_letter
        self._max_deliver = max_deliver
        self._backoff = tuple(backoff)
        self._batch = batch
        self._linger = linger
        #: whether a linger is worth taking now (`corral.bus.pacing`): not on a quiet bus (None:
        #: not paced, the linger follows every partial batch)
        self._pace = Linger(linger) if paced else None
        self._batch_handler = batch_handler
        self._unavailable_backoff = unavailable_backoff or UnavailableBackoff()
        self._stopping = False
        self._stop_requested = asyncio.Event()
        self._fetching = False
        #: The server had more messages for us after the last batch's last one (its num_pending).
        self._behind = False
        #: True while a dependency is down and this consumer holds a message, waiting for it.
        self.waiting_for_dependency = False
        #: Messages handled and not yet acknowledged: sent together (`_send_acks`).
        self._acks: list[Any] = []
        #: Called with a time (from `clock`) before which every message published on the consumer's
        #: subjects has been handled: after a fetch that left nothing waiting, its batch handled,
        #: and after a fetch that found nothing. A service judging what it has not been told
        #: (placement: heartbeats that stopped listing a gang) counts only up to it.
        self.caught_up: Callable[[float], None] | None = None
        self.clock: Callable[[], float] = time.time
        self.task: asyncio.Task[None] = asyncio.create_task(self._run(), name=f"consumer:{durable}")

    async def backlog(self) -> tuple[int, int]:
        """(messages not yet delivered, delivered but not acknowledged) of this durable, as the
        server counts them: its lag (metrics and readiness, `corral.telemetry`)."""
        info = await self._sub.consumer_info()
        return int(info.num_pending or 0), int(info.num_ack_pending or 0)

    async def stop(self) -> None:
        self._stopping = True
        self._stop_requested.set()
        if self._fetching and not self.task.done():
            self.task.cancel()  # idle in a long poll: nothing to finish
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    async def __aenter__(self) -> RunningConsumer:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    async def _run(self) -> None:
        failures = 0
        try:
            while not self._stopping:
                asked_at = self.clock()
                try:
                    self._fetching = True
                    msgs = await self._fetch()
                    failures = 0
                except (nats.errors.TimeoutError, TimeoutError):
                    self._caught_up(asked_at)
                    continue
                except asyncio.CancelledError:
                    if self._stopping:
                        return
                    raise
                except Exception as exc:
                    failures += 1
                    delay = self._unavailable_backoff.delay(failures)
                    if is_unavailable(exc):
                        log.warning("consumer %s: fetch failed (%s: %s); retrying in %.1fs", self.durable,
                                    type(exc).__name__, exc, delay)
                    else:
                        log.exception("consumer %s: fetch failed; retrying in %.1fs", self.durable, delay)
                    await self._pause(delay)
                    continue
                finally:
                    self._fetching = False
                fetched = len(msgs)
                self._behind = _more_waiting(msgs)
                try:
                    await self._handle_fetched(msgs)
                except Exception as exc:
                    # Never the end of the consumer: a task that ended here would leave its service
                    # running without consuming, and nothing would say so. What was not settled
                    # comes back after ack_wait.
                    failures += 1
                    delay = self._unavailable_backoff.delay(failures)
                    log.log(logging.WARNING if is_unavailable(exc) else logging.ERROR,
                            "consumer %s: settling a fetched batch failed (%s: %s); fetching again in %.1fs",
                            self.durable, type(exc).__name__, exc, delay, exc_info=not is_unavailable(exc))
                    await self._pause(delay)
                    continue
                if not self._behind:
                    self._caught_up(asked_at)
                linger = self._pace.after(fetched) if self._pace is not None else self._linger
                if linger > 0 and fetched < self._batch and not self._behind and not self._stopping:
                    # A partial batch under a stream of messages means we are keeping up: let the
                    # next one gather for a moment (one fetch round trip, one confirmed ack, one
                    # handler pass per batch instead of per trickle of messages; under load batches
                    # fill and no time is lost). On a quiet bus nothing would gather: no wait.
                    await asyncio.sleep(linger)
        finally:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    def _caught_up(self, at: float) -> None:
        if self.caught_up is not None and not self._stopping:
            self.caught_up(at)

    async def _handle_fetched(self, msgs: list[Any]) -> None:
        """Hand a fetched batch to the handler(s), settle each message, send the acknowledgements."""
        if self._batch_handler is not None and not self._stopping:
            await self._settle_batch(msgs)
            msgs = []
        for index, msg in enumerate(msgs):
            if self._stopping:
                for unhandled in msgs[index:]:
                    with contextlib.suppress(Exception):
                        await unhandled.nak()
                break
            await self._settle(msg, confirm=index == len(msgs) - 1, waiting=msgs[index + 1:])
        await self._send_acks(confirm=True)

    async def _fetch(self) -> list[Any]:
        """What is there (up to `batch`), else what arrives within a short gathering window, else
        block until the next message. On a quiet bus (no linger worth taking, `corral.bus.pacing`)
        it blocks for the next message at once.

        Why not one `fetch(batch, timeout=5)`: once its pull request has to wait on the server,
        nats-py returns only when the batch is FULL or the timeout expires, so a consumer that
        had caught up handled its next messages up to 5 s late (or after `batch` of them).

        Behind (`_behind`), the gathering window is longer: nats-py stops collecting a batch when
        the window ends, and on a busy event loop the messages the server sends arrive slower
        than that; with a short window under a backlog of hundreds a consumer fetches part of a
        batch, lingers as if it had caught up, and reports reach it late (bench/README.md).
        """
        if self._pace is not None and self._linger > 0 and not self._behind and not self._pace.busy():
            # A quiet bus: the next message is handed over as it arrives; a window here would
            # hold it to the window's end (a lingering pull returns when its batch is full or its
            # time is up).
            return await self._next()
        gather = _BEHIND_GATHER if self._behind else max(self._linger, _MIN_GATHER)
        try:
            return list(await self._sub.fetch(self._batch, timeout=gather))
        except (nats.errors.TimeoutError, TimeoutError):
            pass
        return await self._next()

    async def _next(self) -> list[Any]:
        """Block until the next message; with it, what the server holds behind it already (the
        events of one commit are published together: one batch to handle and acknowledge, not a
        fetch, a handler pass and a confirmed ack each)."""
        msgs = list(await self._sub.fetch(1, timeout=_FETCH_TIMEOUT))
        if self._batch > 1 and _more_waiting(msgs):
            with contextlib.suppress(nats.errors.TimeoutError, TimeoutError):
                msgs += await self._sub.fetch(self._batch - 1, timeout=_MIN_GATHER)
        return msgs

    async def _settle(self, msg: Any, confirm: bool = True, waiting: Sequence[Any] = ()) -> None:
        delivery = await self._delivery(msg)
        if delivery is None:
            return
        try:
            if delivery.delivery_count > self._max_deliver:
                await self._give_up(msg, delivery, f"delivery limit {self._max_deliver} exceeded: the "
                                                   "consumer stopped while handling it last time")
                return

            async def handle(deliveries: list[Delivery]) -> list[BaseException | None]:
                try:
                    with tracing.receiving(self.durable, deliveries), logs.handling(deliveries):
                        await self._handler(deliveries[0])
                    return [None]
                except Exception as exc:
                    return [exc]

            (outcome,) = await handle([delivery])
            if outcome is not None and is_unavailable(outcome):
                held = await self._hold([(msg, delivery)], [outcome], handle, waiting)
                if held is None:
                    return  # stopping: the message was nak'ed for the next consumer
                (outcome,) = held
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
        batch_handler = self._batch_handler

        async def handle(deliveries: list[Delivery]) -> list[BaseException | None]:
            try:
                with tracing.receiving(self.durable, deliveries), logs.handling(deliveries):
                    outcomes = list(await batch_handler(deliveries))
                if len(outcomes) != len(deliveries):
                    raise RuntimeError(f"batch handler returned {len(outcomes)} outcomes for "
                                       f"{len(deliveries)} messages")
                return outcomes
            except Exception as exc:
                return [exc] * len(deliveries)

        outcomes = await handle([d for _, d in todo])
        # Settle what has an answer; then hold what met an unavailable dependency until it has one
        # (the acknowledgements of the rest are sent before the hold begins).
        settled = [(item, outcome) for item, outcome in zip(todo, outcomes, strict=True)
                   if outcome is None or not is_unavailable(outcome)]
        unavailable = [(item, outcome) for item, outcome in zip(todo, outcomes, strict=True)
                       if outcome is not None and is_unavailable(outcome)]
        await self._finish_all(settled, [item[0] for item, _ in unavailable])
        if unavailable:
            held = await self._hold([item for item, _ in unavailable], [o for _, o in unavailable], handle, ())
            if held is not None:
                await self._finish_all(list(zip([item for item, _ in unavailable], held, strict=True)), [])

    async def _finish_all(self, results: Sequence[tuple[tuple[Any, Delivery], BaseException | None]],
                          held: Sequence[Any]) -> None:
        for index, ((msg, delivery), outcome) in enumerate(results):
            try:
                await self._finish(msg, delivery, outcome, confirm=index == len(results) - 1 and not held)
            except Exception:
                log.exception("consumer %s: could not settle message %s", self.durable,
                              delivery.stream_sequence)
        try:
            await self._send_acks(confirm=not held)
        except Exception:
            log.exception("consumer %s: could not acknowledge %d messages", self.durable, len(self._acks))

    async def _hold(self, items: Sequence[tuple[Any, Delivery]], outcomes: Sequence[BaseException | None],
                    handle: Callable[[list[Delivery]], Awaitable[list[BaseException | None]]],
                    waiting: Sequence[Any]) -> list[BaseException | None] | None:
        """A dependency is down: keep `items` (and the fetched-but-unhandled `waiting`) from being
        redelivered, and call `handle` on them again with a capped backoff until no outcome says
        "unavailable". Returns the final outcomes, or None if the consumer is stopping (then the
        held messages are nak'ed: another consumer takes them, without a delivery counted here).
        Nothing is fetched meanwhile: the consumer takes no new message while it cannot work."""
        self.waiting_for_dependency = True
        with contextlib.suppress(Exception):
            await self._send_acks(confirm=False)  # what was handled before is not held with these
        started = time.monotonic()
        first = next(o for o in outcomes if o is not None)
        log.warning("consumer %s: a dependency is unavailable (%s: %s); holding %d message(s) from seq %d "
                    "and retrying until it answers (never dead-lettered)", self.durable, type(first).__name__,
                    first, len(items), items[0][1].stream_sequence)
        attempt, last_log = 0, started
        try:
            while True:
                attempt += 1
                for msg in [m for m, _ in items] + list(waiting):
                    with contextlib.suppress(Exception):
                        await msg.in_progress()
                await self._pause(self._unavailable_backoff.delay(attempt))
                if self._stopping:
                    for msg in [m for m, _ in items]:
                        with contextlib.suppress(Exception):
                            await msg.nak()
                    return None
                outcomes = await handle([d for _, d in items])
                if not any(o is not None and is_unavailable(o) for o in outcomes):
                    log.info("consumer %s: dependency answers again after %.1fs; resuming", self.durable,
                             time.monotonic() - started)
                    return list(outcomes)
                if time.monotonic() - last_log >= 30.0:
                    last_log = time.monotonic()
                    still = next(o for o in outcomes if o is not None)
                    log.warning("consumer %s: dependency still unavailable after %.0fs (%s: %s)", self.durable,
                                last_log - started, type(still).__name__, still)
        finally:
            self.waiting_for_dependency = False

    async def _pause(self, seconds: float) -> None:
        """Sleep, but wake at once when the consumer is asked to stop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop_requested.wait(), seconds)

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
        if outcome is not None and is_unavailable(outcome):
            # Not bad input: never dead-lettered (only reached if holding was skipped).
            await msg.nak(delay=self._unavailable_backoff.cap)
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
        self._acks.append(msg)
        if confirm or self._stopping:
            await self._send_acks(confirm=True)

    async def _send_acks(self, confirm: bool) -> None:
        """Acknowledge the messages handled since the last call, in one socket write (`ack_many`).

        `confirm`: the last one waits for the server's reply: the server handles one connection's
        acks in order, so that confirms the earlier ones too, and once `stop()` returns nothing
        handled comes back. One round trip per batch instead of per message: that round trip
        was most of a busy consumer's time. Until sent, a handled message is only redelivered
        after a crash, as one whose ack was lost would be (consumers are idempotent)."""
        msgs, self._acks = self._acks, []
        if not msgs:
            return
        last = msgs.pop() if confirm or self._stopping else None
        await ack_many(msgs)
        if last is not None:
            await last.ack_sync(timeout=_ACK_TIMEOUT)

    async def _give_up(self, msg: Any, delivery: Delivery, error: str) -> None:
        log.error("consumer %s: dead-lettering %s seq %d: %s", self.durable, delivery.subject,
                  delivery.stream_sequence, error)
        await self._dead_letter(delivery, error)
        await msg.term()


def dead_letter_publisher(publish: Callable[[str, bytes, str, dict[str, str]], Awaitable[object]],
                          subject_for: Callable[[str, int], str], durable: str) -> DeadLetter:
    """A `DeadLetter` that publishes through `publish(subject, data, msg_id, headers)` to
    `subject_for(stream, sequence)` of the original message: one subject per original message, so
    the dead-letter stream (one message per subject) keeps one entry however many consumers give
    up on it, and the msg id (also per original message) drops a second one within the window."""

    async def dead_letter(delivery: Delivery, error: str) -> None:
        await publish(subject_for(delivery.stream, delivery.stream_sequence), delivery.data,
                      dead_letter_msg_id(delivery, durable), dead_letter_headers(delivery, durable, error))

    return dead_letter
