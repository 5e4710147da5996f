"""Reading and replaying the dead-letter stream.

Why: a message dead-lettered by mistake (a bug fixed since, a queue created too late) must be put
back, and an operator must see why it was dead-lettered without the `nats` tool. Each dead letter is
listed with where it came from, which consumer gave up, after how many deliveries and why; `replay`
republishes the original data and headers to the original subject (with the original `Nats-Msg-Id`,
so a consumer's tracking still makes it exactly-once) and then removes the entry. A service runs
`replay`, on an admin's request (`corral.services.dead_letter_replay`): republishing to any inbox
subject is a right no person's identity has.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from nats.js.errors import NotFoundError

from corral.bus.bus import Bus
from corral.bus.delivery import (
    DLQ_CONSUMER,
    DLQ_DELIVERIES,
    DLQ_ERROR,
    DLQ_MSG_ID,
    DLQ_SEQUENCE,
    DLQ_STREAM,
    DLQ_SUBJECT,
)
from corral.bus.naming import DLQ

_DLQ_HEADERS = (DLQ_SUBJECT, DLQ_STREAM, DLQ_SEQUENCE, DLQ_CONSUMER, DLQ_DELIVERIES, DLQ_ERROR, DLQ_MSG_ID)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One entry of the dead-letter stream."""

    seq: int
    subject: str  # the original subject
    origin_stream: str
    origin_seq: int
    consumer: str
    deliveries: int
    error: str
    msg_id: str | None
    stored_at: datetime | None
    data: bytes
    headers: dict[str, str]
    #: its own subject in the dead-letter stream (`<ns>.dlq.<STREAM>.<seq>`), which says who may
    #: have written it (`corral.bus.auth`)
    dlq_subject: str = ""

    def age_seconds(self, now: datetime) -> float | None:
        return None if self.stored_at is None else max(0.0, (now - self.stored_at).total_seconds())

    def original_headers(self) -> dict[str, str]:
        return {k: v for k, v in self.headers.items() if k not in _DLQ_HEADERS and not k.startswith("Nats-")}


@dataclass(frozen=True, slots=True)
class Replayed:
    """What `replay` did with one dead letter."""

    seq: int
    subject: str
    replayed: bool
    message: str


def _entry(raw: Any) -> DeadLetter:
    headers = dict(raw.headers or {})
    stored = raw.time if isinstance(getattr(raw, "time", None), datetime) else None
    if stored is not None and stored.tzinfo is None:
        stored = stored.replace(tzinfo=UTC)

    def number(key: str) -> int:
        try:
            return int(headers.get(key, "0"))
        except ValueError:
            return 0

    return DeadLetter(seq=int(raw.seq), subject=headers.get(DLQ_SUBJECT, ""), origin_stream=headers.get(DLQ_STREAM, ""),
                      origin_seq=number(DLQ_SEQUENCE), consumer=headers.get(DLQ_CONSUMER, ""),
                      deliveries=number(DLQ_DELIVERIES), error=headers.get(DLQ_ERROR, ""),
                      msg_id=headers.get(DLQ_MSG_ID), stored_at=stored, data=bytes(raw.data or b""), headers=headers,
                      dlq_subject=str(getattr(raw, "subject", "") or ""))


async def list_dead_letters(bus: Bus, *, limit: int = 100_000) -> list[DeadLetter]:
    """Every dead letter, oldest first (the stream is bounded: see `BusLimits.dlq_max_msgs`)."""
    stream = bus.names.stream(DLQ)
    out: list[DeadLetter] = []
    seq = 1
    while len(out) < limit:
        try:
            raw = await bus.js.get_msg(stream, seq=seq, subject=bus.names.wildcard(DLQ), next=True)
        except NotFoundError:
            break
        out.append(_entry(raw))
        seq = int(raw.seq) + 1
    return out


async def get_dead_letter(bus: Bus, seq: int) -> DeadLetter | None:
    try:
        return _entry(await bus.js.get_msg(bus.names.stream(DLQ), seq=seq))
    except NotFoundError:
        return None


async def replay(bus: Bus, letter: DeadLetter) -> Replayed:
    """Republish `letter` to its original subject, then remove it from the dead-letter stream.

    With the original msg id: a consumer's tracking row still makes handling it exactly-once. If
    the original is still within JetStream's duplicate window the publish is dropped as a
    duplicate; the entry is then kept and the caller told to retry later."""
    if not letter.subject:
        return Replayed(letter.seq, letter.subject, False, "no original subject in its headers; not replayable")
    msg_id = letter.msg_id or f"replay:{letter.origin_stream}:{letter.origin_seq}"
    try:
        published = await bus.publish(letter.subject, letter.data, msg_id, letter.original_headers())
    except ValueError as exc:
        return Replayed(letter.seq, letter.subject, False, str(exc))
    if published.duplicate:
        return Replayed(letter.seq, letter.subject, False,
                        "the original is still within the bus's duplicate window (2 minutes); replay it later")
    await bus.js.delete_msg(bus.names.stream(DLQ), letter.seq)
    return Replayed(letter.seq, letter.subject, True, f"replayed as {published.stream} #{published.sequence}")
