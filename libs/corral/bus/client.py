"""The NATS client every Corral process uses: nats-py's, with a faster header parser.

Every event the relay publishes carries five to six headers (stream, stream version, position,
correlation, message id, trace context when traced; `corral.bus.relay.event_headers`),
and each event is delivered to four or five services. nats-py parses a message's header block in
Python line by line (`Client._parse_header_lines`: a partition, two strips, two decodes and a
per-character whitespace scan for each line), ~21 us per event message: a tenth of the CPU that
the preemption service spent per event in `bench/e2e.py` at 100 jobs/s (py-spy; bench/README.md).

So an ASCII block (all Corral sends) is split as text, and any other is read with one regular
expression (~10 us), with the same result for every header
block a NATS server forwards (lines `Name: value` separated by CRLF; a name is an HTTP token: no
whitespace, no colon, ASCII only; the value's surrounding whitespace stripped, decoded as UTF-8 with
U+FFFD for bad bytes). `tests/unit/test_bus_client.py` checks it against nats-py's own parser on
arbitrary header blocks, and that nats-py still calls the method this overrides.

Header blocks are built faster too (`header_block`): nats-py validates and encodes each header
name on every message (a strip, a regular expression, an encode, ~2 us a header, several headers an
event); the names Corral sends are a handful, so each is checked once and kept, and the block is
encoded once. The bytes sent are nats-py's, byte for byte (`tests/unit/test_bus_client.py`, hypothesis).

And a message already received is handed over at once: nats-py's JetStream `fetch` takes each
message of a batch from the subscription with `Subscription.next_msg`, which makes a uuid4 (a
getrandom system call), a task and an `asyncio.wait_for` timer for every message, also for the
ones already waiting in the subscription's queue: most of the ~80 us of CPU a service spends on
each event delivered to it with a handler doing nothing (`bench/bus.py`). `Subscription`
returns a queued message directly and waits as nats-py does only when the queue is empty.

The relay's publishes and their acknowledgements take shorter paths too: `Client.publish_batch`
writes a batch's HPUB frames (nats-py's bytes, with the checks of its `publish`) in one command
instead of one `publish` call each, and a subscription made with `subscribe_direct` (the relay's
publish acknowledgements) has each message handed to its callback from the read loop, without
nats-py's `Msg`, queue and subscription task for each (a third of a relayed event's client CPU).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from nats import errors
from nats.aio.client import _HEADER_KEY_RE, _HEADER_VALUE_NEWLINES, _validate_subject
from nats.aio.client import Client as _NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as _NatsSubscription
from nats.protocol import command

_log = logging.getLogger(__name__)

#: One header line of a block whose only CR and LF are its CRLF line ends: blanks, a name (ASCII
#: but whitespace and the colon), blanks, a colon, the value up to the line's end (its CR is
#: stripped with the value's blanks). Names and blanks as `bytes.strip` and `str.isspace` see them.
#: what `bytes.strip` strips, and the ASCII characters `str.isspace` holds (those a name may not contain)
_BLANKS = " \t\n\r\x0b\x0c"
_SPACES = frozenset(" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f")
_LINE = re.compile(rb"^[ \t\x0b\x0c]*([\x00-\x08\x0e-\x1b!-9;-\x7f]*)[ \t\x0b\x0c]*:(.*)$", re.MULTILINE)


DirectHandler = Callable[[str, bytes, "dict[str, str] | None"], Awaitable[None]]
"""A `subscribe_direct` callback: the message's subject, payload and headers (None: none)."""


class Client(_NatsClient):
    """nats-py's client, parsing header blocks with `parse_header_lines`; its subscriptions read
    without a callback (JetStream pull consumers, `next_msg`) are `Subscription`s."""

    def __init__(self) -> None:
        super().__init__()
        #: subscription id -> its `subscribe_direct` callback
        self._direct: dict[int, DirectHandler] = {}

    async def subscribe_direct(self, subject: str, handler: DirectHandler) -> int:
        """Subscribe with `handler` called from the read loop for each message, in order (see the
        module docstring); returns the subscription's id. For short callbacks only: the read loop
        waits for each."""
        sub = await super().subscribe(subject)
        self._direct[sub._id] = handler
        return int(sub._id)

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes) -> None:
        handler = self._direct.get(sid)
        if handler is None:
            return await super()._process_msg(sid, subject, reply, data, headers)
        self.stats["in_msgs"] += 1
        self.stats["in_bytes"] += len(data)
        try:
            await handler(subject.decode(), data, await self._process_headers(headers) if headers else None)
        except Exception:  # the read loop must go on (nats-py's subscription tasks log and go on too)
            _log.exception("callback of subscription %d failed on a message to %r", sid, subject)

    async def publish_batch(self, messages: Sequence[tuple[str, str, bytes, dict[str, Any]]]) -> None:
        """Publish (subject, reply, payload, headers) messages, in order, in one command: the
        frames nats-py's `publish` sends for each, byte for byte, after the same checks, but one
        call for the batch. Nothing is sent if any message fails a check."""
        if self.is_closed:
            raise errors.ConnectionClosedError
        if self.is_draining_pubs:
            raise errors.ConnectionDrainingError
        frames: list[bytes] = []
        size = 0
        for subject, reply, payload, headers in messages:
            if not self._skip_subject_validation:
                _validate_subject(subject)
                if reply:
                    _validate_subject(reply)
            if len(payload) > self._max_payload:
                raise errors.MaxPayloadError
            if subject == "":
                raise errors.BadSubjectError
            frames.append(command.hpub_cmd(subject, reply, header_block(headers), payload))
            size += len(payload)
        if not self.is_connected and (self._max_pending_size <= 0
                                      or size + self._pending_data_size > self._max_pending_size):
            raise errors.OutboundBufferLimitError
        self.stats["out_msgs"] += len(frames)
        self.stats["out_bytes"] += size
        await self._send_command(b"".join(frames))
        if self._flush_queue is not None and self._flush_queue.empty():
            await self._flush_pending()

    @staticmethod
    def _parse_header_lines(raw: bytes) -> dict[str, str]:
        return parse_header_lines(raw)

    async def _send_publish(self, subject: str, reply: str, payload: bytes, payload_size: int,
                            headers: dict[str, Any] | None) -> None:
        """nats-py's, with the header block from `header_block`."""
        if headers is None:
            return await super()._send_publish(subject, reply, payload, payload_size, headers)
        if subject == "":
            raise errors.BadSubjectError
        pub_cmd = command.hpub_cmd(subject, reply, header_block(headers), payload)
        self.stats["out_msgs"] += 1
        self.stats["out_bytes"] += payload_size
        await self._send_command(pub_cmd)
        if self._flush_queue is not None and self._flush_queue.empty():
            await self._flush_pending()

    async def subscribe(self, *args: Any, **kwargs: Any) -> _NatsSubscription:
        sub = await super().subscribe(*args, **kwargs)
        if type(sub) is _NatsSubscription and sub._cb is None and sub._future is None:
            sub.__class__ = Subscription  # adds no state: only `next_msg` differs
        return sub


class Subscription(_NatsSubscription):
    """nats-py's subscription, whose `next_msg` returns a message already received without a task."""

    async def next_msg(self, timeout: float | None = 1.0) -> Msg:
        queue = self._pending_queue
        if queue.empty() or self._conn.is_closed:
            return await super().next_msg(timeout)  # waits (or raises) as nats-py does
        msg = queue.get_nowait()
        # what nats-py's next_msg does with a message it got
        self._pending_size -= len(msg.data)
        queue.task_done()
        return msg


def parse_header_lines(raw: bytes) -> dict[str, str]:
    """The headers of a NATS header block (after its `NATS/1.0` line), as nats-py parses them.

    nats-py splits the block on CRLF, skips a line without a colon, strips the name (skipping one
    that is not ASCII or has whitespace inside) and the value, and decodes the value as UTF-8 with
    replacement characters; a later line of the same name wins."""
    if not raw.count(b"\r") == raw.count(b"\r\n") == raw.count(b"\n"):
        return _NatsClient._parse_header_lines(raw)  # a bare CR or LF: never sent by a NATS client
    if raw.isascii():  # every block Corral sends: split as text, with bytes.strip's blanks
        out: dict[str, str] = {}
        for line in raw.decode("ascii").split("\r\n"):
            name, colon, value = line.partition(":")
            if colon:
                name = name.strip(_BLANKS)
                if _SPACES.isdisjoint(name):
                    out[name] = value.strip(_BLANKS)
        return out
    return {name.decode("ascii"): value.strip().decode("utf-8", "replace") for name, value in _LINE.findall(raw)}


#: header name as given -> its `Name: ` ("" for a name nats-py skips: blank), for names seen
#: before; bounded, as names come from code (a name refused is never kept: it raises)
_NAMES: dict[str, str] = {}
_NAMES_KEPT = 256


def header_block(headers: dict[str, Any]) -> bytes:
    """The header block nats-py's `_send_publish` builds for `headers`, byte for byte: the
    `NATS/1.0` line, each `Name: value` line (the name stripped, skipped when blank, refused with
    BadHeaderError unless an HTTP token; the value stripped, its CR and LF made spaces), a blank
    line. Built as one string and encoded once (UTF-8 of the whole is that of its parts): the
    relay builds one per event it publishes."""
    parts = ["NATS/1.0\r\n"]
    for name, value in headers.items():
        head = _NAMES.get(name)
        if head is None:
            key = name.strip()
            if key and not _HEADER_KEY_RE.fullmatch(key):
                raise errors.BadHeaderError(key)
            head = key + ": " if key else ""
            if len(_NAMES) < _NAMES_KEPT:
                _NAMES[name] = head
        if head:
            value = value.strip()
            if "\r" in value or "\n" in value:
                value = value.translate(_HEADER_VALUE_NEWLINES)
            parts.append(head + value + "\r\n")
    parts.append("\r\n")
    return "".join(parts).encode()


async def ack_many(msgs: Sequence[Msg]) -> None:
    """Acknowledge JetStream messages in one socket write: for each, the `PUB <reply>  0` frame
    nats-py's `Msg.ack` sends, byte for byte, without its per-message publish call and flush
    request (a consumer acknowledges every message it is delivered; this is a tenth of a delivery's
    CPU). Messages not from a nats-py client (a test's stand-ins) are acknowledged one by one."""
    if not msgs:
        return
    client = getattr(msgs[0], "_client", None)
    if not isinstance(client, _NatsClient) or any(m._client is not client for m in msgs):
        for msg in msgs:
            await msg.ack()
        return
    if client.is_closed:
        raise errors.ConnectionClosedError
    frames = []
    for msg in msgs:
        if not msg.reply or msg._ackd:
            msg._check_reply()  # raises as `Msg.ack` would
        frames.append(f"PUB {msg.reply}  0\r\n\r\n")
        msg._ackd = True
    client.stats["out_msgs"] += len(msgs)
    await client._send_command("".join(frames).encode())
    if client._flush_queue is not None and client._flush_queue.empty():
        await client._flush_pending()


async def connect(servers: str | list[str], **options: Any) -> Client:
    """`nats.connect` with `Client`."""
    client = Client()
    await client.connect(servers, **options)
    return client
