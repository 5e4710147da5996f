"""The relay's batches are acknowledged by their last message only while nothing is in doubt
(`OutboxRelay._publish_chained`): after a batch stored with no duplicate; a duplicate or any
failure sends the batch again with each message acknowledged, and the next ones too until a batch
is stored clean."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

import pytest

from corral.bus import OutboxRelay, Outgoing, Published
from corral.bus.relay import EXPECTED_LAST_MSG_ID
from corral.eventstore import StoredEvent

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def events(first: int, count: int) -> list[StoredEvent]:
    return [StoredEvent(event_id=f"e{p}", stream="job-a", type="JobAdmitted", schema_version=1, data=b"{}",
                        correlation_id=None, causation_id=None, occurred_at=NOW, version=p, position=p,
                        recorded_at=NOW) for p in range(first, first + count)]


class Bus:
    """Answers each publish call from a script: "ok", "duplicate" (every message, or the last,
    a duplicate) or an exception; records which call carried which message ids."""

    max_message_bytes = 1 << 20

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.calls: list[tuple[str, list[str]]] = []

    def _answer(self, kind: str, messages: list[Outgoing]) -> bool:
        self.calls.append((kind, [m.msg_id for m in messages]))
        answer = self.script.pop(0) if self.script else "ok"
        if isinstance(answer, BaseException):
            raise answer
        return bool(answer == "duplicate")

    async def publish_many(self, messages: list[Outgoing]) -> list[Published]:
        duplicate = self._answer("each", messages)
        return [Published("EVENTS", i + 1, duplicate) for i in range(len(messages))]

    async def publish_acked_by_last(self, messages: list[Outgoing]) -> Published:
        return Published("EVENTS", len(messages), self._answer("last", messages))


class Store:
    async def save_relay_position(self, name: str, position: int) -> None:
        pass


def relay(bus: Bus) -> OutboxRelay:
    return OutboxRelay(cast(Any, Store()), cast(Any, bus), lambda e: f"ns.events.{e.type}")


async def test_a_batch_goes_acked_by_its_last_message_after_one_stored_clean() -> None:
    bus = Bus([])
    r = relay(bus)
    await r._publish_batch(events(1, 3))
    await r._publish_batch(events(4, 3))
    await r._publish_batch(events(7, 1))  # one message: acknowledged as such
    assert bus.calls == [("each", ["e1", "e2", "e3"]), ("last", ["e4", "e5", "e6"]), ("each", ["e7"])]


async def test_a_duplicate_sends_the_batch_again_each_acknowledged_until_one_is_clean() -> None:
    bus = Bus(["ok", "duplicate", "duplicate", "ok"])
    r = relay(bus)
    await r._publish_batch(events(1, 2))  # clean
    await r._publish_batch(events(3, 2))  # the last a duplicate: in doubt, again with each acked ...
    await r._publish_batch(events(5, 2))  # ... where a duplicate keeps the next one acked each
    await r._publish_batch(events(7, 2))
    assert bus.calls == [("each", ["e1", "e2"]), ("last", ["e3", "e4"]), ("each", ["e3", "e4"]),
                         ("each", ["e5", "e6"]), ("last", ["e7", "e8"])]


async def test_a_failed_batch_acked_by_its_last_goes_again_each_acknowledged() -> None:
    bus = Bus(["ok", TimeoutError(), "ok"])
    r = relay(bus)
    await r._publish_batch(events(1, 2))
    await r._publish_batch(events(3, 3))
    assert bus.calls == [("each", ["e1", "e2"]), ("last", ["e3", "e4", "e5"]), ("each", ["e3", "e4", "e5"])]


async def test_what_fails_each_acknowledged_is_raised() -> None:
    bus = Bus(["ok", TimeoutError(), TimeoutError()])
    r = relay(bus)
    await r._publish_batch(events(1, 2))
    with pytest.raises(TimeoutError):
        await r._publish_batch(events(3, 2))


async def test_a_batch_acked_by_its_last_is_chained() -> None:
    """What makes the last acknowledgement say the whole batch was stored, in order."""
    sent: list[list[Outgoing]] = []
    bus = Bus([])

    async def publish_acked_by_last(messages: list[Outgoing]) -> Published:
        sent.append(messages)
        return Published("EVENTS", 1, False)

    bus.publish_acked_by_last = publish_acked_by_last  # type: ignore[method-assign]
    r = relay(bus)
    await r._publish_batch(events(1, 2))
    await r._publish_batch(events(3, 3))
    assert [dict(m.headers or {}).get(EXPECTED_LAST_MSG_ID) for m in sent[0]] == [None, "e3", "e4"]
