"""What a consumer's handler receives, how it says "try again" or "never", and what a dead letter
carries. Pure: the consumer loop (`corral.bus.consumer`) does the I/O.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

MSG_ID = "Nats-Msg-Id"

# Headers of a dead letter, so an operator (or a replay tool) knows what failed where and why.
DLQ_SUBJECT = "Corral-Dlq-Subject"
DLQ_STREAM = "Corral-Dlq-Stream"
DLQ_SEQUENCE = "Corral-Dlq-Sequence"
DLQ_CONSUMER = "Corral-Dlq-Consumer"
DLQ_DELIVERIES = "Corral-Dlq-Deliveries"
DLQ_ERROR = "Corral-Dlq-Error"
DLQ_MSG_ID = "Corral-Dlq-Msg-Id"

_MAX_HEADER_VALUE = 1024


@dataclass(frozen=True, slots=True)
class Delivery:
    """One delivery of a JetStream message to a consumer.

    `delivery_count` starts at 1 and grows with each redelivery; `stream_sequence` identifies the
    message in its stream for good (use it, or the msg id, as the tracking key).
    """

    subject: str
    data: bytes
    headers: Mapping[str, str]
    delivery_count: int
    stream: str
    stream_sequence: int
    consumer_sequence: int
    timestamp: datetime | None

    @property
    def msg_id(self) -> str | None:
        """The publisher's `Nats-Msg-Id` (the event_id for events from the outbox relay)."""
        return self.headers.get(MSG_ID)


Handler = Callable[[Delivery], Awaitable[None]]
"""Returns normally to acknowledge; raises `Retry` or `Poison` to say otherwise."""


class Retry(Exception):
    """A transient failure: redeliver later (after `delay` seconds, or the consumer's backoff).

    Any other unexpected exception is treated the same way; after the delivery limit the message
    is dead-lettered either way.
    """

    def __init__(self, reason: str, *, delay: float | None = None) -> None:
        super().__init__(reason)
        self.delay = delay


class Poison(Exception):
    """A permanent failure: this message can never be processed; dead-letter it now."""


def retry_delay(backoff: Sequence[float], delivery_count: int) -> float:
    """Delay before the next attempt after failed delivery number `delivery_count` (1-based):
    backoff[0] after the first, backoff[1] after the second, the last entry from then on."""
    if not backoff:
        return 0.0
    return float(backoff[min(max(delivery_count, 1), len(backoff)) - 1])


def _header_value(text: str) -> str:
    # NATS headers are line based: no CR/LF, and keep them short.
    flat = " ".join(text.split())
    return flat if len(flat) <= _MAX_HEADER_VALUE else flat[: _MAX_HEADER_VALUE - 3] + "..."


def dead_letter_headers(delivery: Delivery, consumer: str, error: str) -> dict[str, str]:
    """The original headers (minus NATS' own) plus where the message came from and why it failed."""
    headers = {key: value for key, value in delivery.headers.items() if not key.startswith("Nats-")}
    headers.update({
        DLQ_SUBJECT: delivery.subject,
        DLQ_STREAM: delivery.stream,
        DLQ_SEQUENCE: str(delivery.stream_sequence),
        DLQ_CONSUMER: consumer,
        DLQ_DELIVERIES: str(delivery.delivery_count),
        DLQ_ERROR: _header_value(error) or "unknown error",
    })
    if delivery.msg_id is not None:
        headers[DLQ_MSG_ID] = delivery.msg_id
    return headers


def dead_letter_msg_id(delivery: Delivery, consumer: str) -> str:
    """One dead letter per original message (its stream and sequence), whichever consumer gives up
    on it, and none again if a consumer crashes between publishing it and `term`. `consumer` is
    in the headers, not in the key: keyed by consumer, one garbage event made one entry per
    service."""
    del consumer
    return f"dlq:{delivery.stream}:{delivery.stream_sequence}"
