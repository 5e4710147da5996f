"""The relay's messages reach the events stream in the log's order, also when JetStream refuses one.

Why: a batch is sent pipelined, and while a stream's leader changes JetStream may refuse a message
and store the next; the batch sent again then stores the refused one after it. A job's
JobAdmitted then comes before its JobSubmitted, and every service, folding only newer versions
of a stream, skips the submission: the job waits forever and nothing says why. Chained
(`corral.bus.relay.chained`), nothing after a refused message is stored. Here the refusal is a
size the stream does not take (a real nats-server refusing one message of a batch and taking the
next); a leader change is the other way to it (`tests/e2e/test_nats_cluster.py`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from nats.js.errors import BadRequestError

from corral.bus import Bus, Outgoing, is_unavailable
from corral.bus.limits import BusLimits
from corral.bus.naming import EVENTS
from corral.bus.relay import chained

LIMIT = 4096


@pytest.fixture
async def bus(nats_url: str, namespace: str) -> AsyncIterator[Bus]:
    """Its events stream takes messages up to `LIMIT` bytes, well below what the server takes."""
    limits = BusLimits(max_event_bytes=LIMIT, max_spec_bytes=LIMIT // 2)
    b = await Bus.connect(nats_url, namespace=namespace, limits=limits)
    await b.ensure_streams()
    try:
        yield b
    finally:
        await b.close()


async def stored(bus: Bus) -> list[bytes]:
    stream = bus.names.stream(EVENTS)
    last = (await bus.js.stream_info(stream)).state.last_seq
    return [bytes((await bus.js.get_msg(stream, seq)).data or b"") for seq in range(1, last + 1)]


def batch(bus: Bus, refused: int | None) -> list[Outgoing]:
    subject = bus.names.events_subject("JobAdmitted")
    return [Outgoing(subject, b"x" * (2 * LIMIT) if i == refused else str(i).encode(), f"event-{i}")
            for i in range(4)]


async def test_nothing_after_a_refused_message_of_a_chained_batch_is_stored(bus: Bus) -> None:
    with pytest.raises(BadRequestError):
        await bus.publish_many(chained(batch(bus, refused=1)))
    assert await stored(bus) == [b"0"]

    # sent again as the relay does once the refusal has passed: every message once, in order
    await bus.publish_many(chained(batch(bus, refused=None)))
    assert await stored(bus) == [b"0", b"1", b"2", b"3"]


async def test_unchained_the_message_after_a_refused_one_overtakes_it(bus: Bus) -> None:
    """What the chain prevents: the same batch, unchained, stores 2 and 3 before 1."""
    with pytest.raises(BadRequestError):
        await bus.publish_many(batch(bus, refused=1))
    await bus.publish_many(batch(bus, refused=None))
    assert await stored(bus) == [b"0", b"2", b"3", b"1"]


async def test_a_message_refused_for_its_chain_is_retried_not_dead() -> None:
    """10070 (the stream's last message is not the one expected): the batch goes again."""
    refusal = BadRequestError(code=400, err_code=10070, description="wrong last msg ID: event-0")
    assert is_unavailable(refusal)


async def test_acked_by_its_last_a_refused_message_is_said_by_the_last(bus: Bus) -> None:
    """Only the last message asks for an answer (`Bus.publish_acked_by_last`): the refused one
    says nothing, and the last, whose chain it broke, is refused: nothing after the refusal is
    stored, and the batch sent again each acknowledged stores every message once, in order."""
    with pytest.raises(BadRequestError) as refused:
        await bus.publish_acked_by_last(chained(batch(bus, refused=1)))
    assert refused.value.err_code == 10070  # the last's chain: the stream's last message is event-0
    assert await stored(bus) == [b"0"]

    await bus.publish_many(chained(batch(bus, refused=None)))
    assert await stored(bus) == [b"0", b"1", b"2", b"3"]


async def test_acked_by_its_last_a_batch_stored_whole_is_answered_once(bus: Bus) -> None:
    last = await bus.publish_acked_by_last(chained(batch(bus, refused=None)))
    assert (last.sequence, last.duplicate) == (4, False)
    assert await stored(bus) == [b"0", b"1", b"2", b"3"]
    again = await bus.publish_acked_by_last(chained(batch(bus, refused=None)))
    assert again.duplicate  # what the relay takes for doubt: it sends the batch again each acked
    assert await stored(bus) == [b"0", b"1", b"2", b"3"]
