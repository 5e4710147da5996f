"""Corral's NATS client parses header blocks as nats-py does, only faster (`corral.bus.client`)."""

from __future__ import annotations

import inspect

from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.client import Client as NatsClient

from corral.bus.client import Client, parse_header_lines
from corral.bus.relay import event_headers

# bytes that matter to the parser: separators, blanks as `bytes.strip` and `str.isspace` see them,
# control bytes, non-ASCII, UTF-8 that is valid and that is not
_PIECES = [b":", b" ", b"\t", b"\x0b", b"\x0c", b"\x1c", b"\x1f", b"\x00", b"\x7f", b"\x85", b"\xa0",
           b"\xc3\xa9", b"\xff", b"a", b"Z", b"-", b"9", b";", b"Corral-Stream", b"value", b"\r", b"\n"]
_bytes = st.lists(st.sampled_from(_PIECES), max_size=12).map(b"".join)
_blanks = st.lists(st.sampled_from([b" ", b"\t", b"\x0b", b"\x0c", b"\x1c", b"\x85"]), max_size=3).map(b"".join)
_name = st.lists(st.sampled_from([b"Corral-Stream", b"a", b"-", b"\x00", b"\x7f", b";", b"\xc3\xa9", b" "]),
                 max_size=3).map(b"".join)
# `blanks name blanks : value` (how a header line is built) or any bytes at all
_line = st.one_of(st.tuples(_blanks, _name, _blanks, _bytes).map(lambda p: p[0] + p[1] + p[2] + b":" + p[3]), _bytes)
_block = st.lists(_line, max_size=8).map(lambda lines: b"\r\n".join(lines) + b"\r\n\r\n")


@settings(max_examples=600)
@given(_block)
def test_any_header_block_is_parsed_as_nats_py_parses_it(raw: bytes) -> None:
    assert parse_header_lines(raw) == NatsClient._parse_header_lines(raw)


_ascii_block = st.lists(st.lists(st.sampled_from([p for p in _PIECES if p.isascii()]), max_size=12).map(b"".join),
                        max_size=8).map(lambda lines: b"\r\n".join(lines) + b"\r\n\r\n")


@settings(max_examples=600)
@given(_ascii_block)
def test_any_ascii_header_block_is_parsed_as_nats_py_parses_it(raw: bytes) -> None:
    """The text split of ASCII blocks (every block Corral sends) against nats-py."""
    assert parse_header_lines(raw) == NatsClient._parse_header_lines(raw)


def test_an_event_message_s_headers_are_parsed_as_they_were_published() -> None:
    from datetime import UTC, datetime

    from corral.eventstore.records import StoredEvent

    event = StoredEvent(stream="job-01J", version=4, position=123456, event_id="01JEVENT", type="GangReserved",
                        schema_version=1, data=b"{}", correlation_id="01JCORR", causation_id="01JCAUSE",
                        occurred_at=datetime(2026, 12, 6, 3, 15, tzinfo=UTC),
                        recorded_at=datetime(2026, 12, 6, tzinfo=UTC))
    headers = {**event_headers(event), "Nats-Msg-Id": "01JEVENT", "traceparent": "00-0af7-b7ad-01"}
    raw = b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items()) + b"\r\n"
    assert parse_header_lines(raw) == headers


def test_nats_py_still_parses_headers_with_the_method_corral_overrides() -> None:
    # an upgrade of nats-py that parsed headers elsewhere would quietly lose the faster parser
    assert "self._parse_header_lines(" in inspect.getsource(NatsClient._process_headers)
    assert Client._parse_header_lines is not NatsClient._parse_header_lines


# --- header blocks sent: nats-py's bytes, byte for byte ----------------------------------------

_name_text = st.lists(st.sampled_from(["Corral-Stream", "Nats-Msg-Id", "a", "-", " ", "\t", "é", ":", "x y", ""]),
                      max_size=3).map("".join)
_value_text = st.lists(st.sampled_from(["v", " ", "\r", "\n", "\t", "é", "\x85", "\u2028", "01J", ":"]),
                       max_size=6).map("".join)


async def _sent(client: NatsClient, headers: dict[str, str] | None) -> bytes | type[BaseException]:
    """The command `client._send_publish` writes for `headers`, or the exception type it raises."""
    written: list[bytes] = []

    async def capture(cmd: bytes, priority: bool = False) -> None:
        written.append(cmd)

    client._send_command = capture  # type: ignore[method-assign]
    client._flush_queue = None
    try:
        await client._send_publish("corral.events.X", "_INBOX.r.1", b"{}", 2, headers)
    except Exception as exc:
        return type(exc)
    return b"".join(written)


@settings(max_examples=600)
@given(st.one_of(st.none(), st.dictionaries(_name_text, _value_text, max_size=6)))
def test_any_headers_are_sent_as_nats_py_sends_them(headers: dict[str, str] | None) -> None:
    import asyncio

    ours, theirs = asyncio.run(_sent(Client(), headers)), asyncio.run(_sent(NatsClient(), headers))
    assert ours == theirs
    again = asyncio.run(_sent(Client(), headers))  # the second time from the kept names
    assert again == theirs


def test_nats_py_still_sends_headers_from_the_method_corral_overrides() -> None:
    source = inspect.getsource(NatsClient.publish)
    assert "_send_publish(" in source, "nats-py no longer publishes through _send_publish: update corral.bus.client"


async def test_acks_sent_together_are_the_bytes_nats_py_sends_for_each() -> None:
    from nats.aio.msg import Msg

    from corral.bus.client import ack_many

    sent: list[bytes] = []

    async def keep(cmd: bytes, priority: bool = False) -> None:
        sent.append(cmd)

    client = Client()
    client._status = Client.CONNECTED
    client._send_command = keep  # type: ignore[method-assign]
    client._flush_queue = None
    replies = [f"$JS.ACK.CORRAL_EVENTS.quota-events.1.{n}.{n}.1765000000000000000.{9 - n}" for n in range(3)]
    for reply in replies:
        await Msg(_client=client, subject="corral.events.JobAdmitted", reply=reply).ack()
    one_by_one, sent[:] = b"".join(sent), []
    msgs = [Msg(_client=client, subject="corral.events.JobAdmitted", reply=reply) for reply in replies]
    await ack_many(msgs)
    assert sent == [one_by_one]
    assert all(m._ackd for m in msgs)


# --- a batch of publishes in one command: nats-py's bytes for each ------------------------------

_subjects = st.sampled_from(["corral.events.JobAdmitted", "corral.events.node.n-1.NodeAssignment", "a.b"])


async def _published(client: NatsClient, messages: list[tuple[str, str, bytes, dict[str, str]]],
                     together: bool) -> tuple[bytes, dict[str, int]] | type[BaseException]:
    written: list[bytes] = []

    async def capture(cmd: bytes, priority: bool = False) -> None:
        written.append(cmd)

    client._status = NatsClient.CONNECTED
    client._max_payload = 1024
    client._send_command = capture  # type: ignore[method-assign]
    client._flush_queue = None
    try:
        if together:
            assert isinstance(client, Client)
            await client.publish_batch(messages)
        else:
            for subject, reply, data, headers in messages:
                await client.publish(subject, data, reply=reply, headers=headers)
    except Exception as exc:
        return type(exc)
    return b"".join(written), {k: client.stats[k] for k in ("out_msgs", "out_bytes")}


@settings(max_examples=300)
@given(st.lists(st.tuples(_subjects, st.sampled_from(["", "_INBOX.r.1"]),
                          st.binary(max_size=8), st.dictionaries(_name_text, _value_text, max_size=4)), max_size=5))
def test_a_batch_of_publishes_is_sent_as_nats_py_sends_each(
        messages: list[tuple[str, str, bytes, dict[str, str]]]) -> None:
    import asyncio

    ours = asyncio.run(_published(Client(), messages, together=True))
    theirs = asyncio.run(_published(NatsClient(), messages, together=False))
    if isinstance(theirs, type):  # a refused message: the batch is refused as a whole, nothing sent
        assert ours is theirs
    else:
        assert ours == theirs


def test_a_batch_over_the_payload_limit_sends_nothing() -> None:
    import asyncio

    from nats import errors

    big = [("corral.events.A", "_INBOX.r.1", b"{}", {"a": "b"}), ("corral.events.B", "", b"x" * 2048, {})]
    assert asyncio.run(_published(Client(), big, together=True)) is errors.MaxPayloadError


async def test_a_direct_subscription_hands_each_message_to_its_callback_in_order() -> None:
    from corral.bus.client import Client as Ours

    client = Ours()
    got: list[tuple[str, bytes, dict[str, str] | None]] = []

    async def keep(subject: str, data: bytes, headers: dict[str, str] | None) -> None:
        got.append((subject, data, headers))

    async def refuse(subject: str, data: bytes, headers: dict[str, str] | None) -> None:
        raise RuntimeError("a bug in the callback")

    client._direct[7] = keep
    client._direct[8] = refuse
    await client._process_msg(7, b"_INBOX.x.1", b"", b'{"stream":"S","seq":1}', b"")
    await client._process_msg(8, b"_INBOX.y.1", b"", b"{}", b"")  # logged; the read loop goes on
    await client._process_msg(7, b"_INBOX.x.2", b"", b"", b"NATS/1.0 503\r\n\r\n")
    assert got == [("_INBOX.x.1", b'{"stream":"S","seq":1}', None), ("_INBOX.x.2", b"", {"Status": "503"})]
    assert client.stats["in_msgs"] == 3
