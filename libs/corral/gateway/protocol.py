"""The local gateway's wire protocol: who is asking is the kernel's answer, never the client's.

A person on a host where Corral runs (the `corral up` host, a login node) has no credential file
of their own; `corral` connects to the gateway's unix socket instead, and the gateway reads the
connection's peer uid (`SO_PEERCRED`, filled in by the kernel at `connect`), maps it to the
account's name and publishes the request under that name. Nothing the client sends can change
who it is: the `user` and `actor` of a request are overwritten, the NATS message id is derived
from the account, and a request type other than a user request is refused.

Framing: one request per connection, one reply. Each is a 4-byte big-endian length and a msgpack
body, decoded by msgspec into the exact types below (unknown fields refused). A request above
`MAX_ASK_BYTES` is refused before its body is read; strings and lists are bounded by the types.
Pure (no sockets here besides `peer_uid`, which reads one option of a connected socket).
"""

from __future__ import annotations

import asyncio
import pwd
import re
import socket
import struct
from collections.abc import Callable
from typing import Annotated

import msgspec

from corral.contracts.envelope import Event
from corral.contracts.problems import ContractError
from corral.contracts.registry import decode
from corral.contracts.subjects import USER_REQUEST_TYPES
from corral.stack.context import GATEWAY_SOCKET_ENV
from corral.submission_ids import submission_msg_id

#: Environment variable naming the gateway's socket (`corral.stack.context.GATEWAY_SOCKET_ENV`).
SOCKET_ENV = GATEWAY_SOCKET_ENV
#: Where `corral service gateway` listens when nothing else is said (a login node's system unit).
DEFAULT_SOCKET = "/run/corral-gateway/gateway.sock"
#: The largest request: a job spec is at most `BusLimits.max_spec_bytes` (256 KiB) in its event.
MAX_ASK_BYTES = 1024 * 1024
#: The largest reply a client accepts (a view of every active job of a large cluster).
MAX_REPLY_BYTES = 512 * 1024 * 1024
#: The longest a request may ask the gateway to wait for its verdict.
MAX_WAIT_SECONDS = 120.0
_HEADER = struct.Struct(">I")
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
#: An account name the bus can carry as one subject token (a dot becomes `~` on the subject).
_ACCOUNT = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$")

JobId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
Wait = Annotated[float, msgspec.Meta(ge=0, le=MAX_WAIT_SECONDS)]


class GatewayRefusal(Exception):
    """A request the gateway does not carry; `code` names the rule, the message says what to do."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class FrameTooLarge(GatewayRefusal):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__("TOO_LARGE", f"a message of {size} bytes is over the gateway's limit of {limit} bytes")


# ---- requests (client -> gateway) --------------------------------------------------------------
class Ask(msgspec.Struct, tag_field="op", forbid_unknown_fields=True, frozen=True):
    """One request to the gateway."""


class WhoAmI(Ask, tag="whoami", frozen=True):
    """Who the gateway takes this connection for."""


class Send(Ask, tag="send", frozen=True):
    """Publish a request (`USER_REQUEST_TYPES`), encoded as the contracts encode it; the gateway
    replaces its user and actor with the connection's account."""

    event: Annotated[bytes, msgspec.Meta(max_length=MAX_ASK_BYTES)]


class Verdict(Ask, tag="verdict", frozen=True):
    """Admission's verdict (JobAdmitted or JobRejected) on one of this account's jobs."""

    job_id: JobId
    wait: Wait = 0.0


class Answer(Ask, tag="answer", frozen=True):
    """The owning service's verdict on a request this account sent (`corral.verdicts`): the
    request as `Send` returned it."""

    event: Annotated[bytes, msgspec.Meta(max_length=MAX_ASK_BYTES)]
    wait: Wait = 0.0


class View(Ask, tag="view", frozen=True):
    """The cluster now (the read model): active jobs, nodes, queues, and the finished jobs asked for."""

    job_ids: Annotated[list[JobId], msgspec.Meta(max_length=1000)] = msgspec.field(default_factory=list)
    states: Annotated[list[Annotated[str, msgspec.Meta(max_length=32)]], msgspec.Meta(max_length=16)] = (
        msgspec.field(default_factory=list))


class JobEvents(Ask, tag="job_events", frozen=True):
    """A job's stream, in order."""

    job_id: JobId


AnyAsk = WhoAmI | Send | Verdict | Answer | View | JobEvents


# ---- replies (gateway -> client) ---------------------------------------------------------------
class StoredRow(msgspec.Struct, frozen=True):
    """One stored event (`corral.eventstore.StoredEvent`) as the gateway passes it on."""

    event_id: str
    stream: str
    type: str
    schema_version: int
    data: bytes
    correlation_id: str | None
    causation_id: str | None
    occurred_at: str
    version: int
    position: int
    recorded_at: str


class Reply(msgspec.Struct, frozen=True, omit_defaults=True):
    """The answer: `ok` and who the gateway took the caller for, or the refusal's code and message."""

    ok: bool
    user: str = ""
    code: str = ""
    error: str = ""
    #: Send: the request as published (its user and actor the account's); Verdict: the event
    #: found (None: none within the wait); Answer: the event that decided the verdict.
    event: bytes | None = None
    #: Answer: the verdict's kind (`corral.verdicts.VerdictKind`), the deciding event's stream
    #: version, and the job it is about.
    verdict: str = ""
    version: int | None = None
    job_id: str = ""
    #: JobEvents: the stream.
    events: list[StoredRow] = msgspec.field(default_factory=list)
    #: View: the active part (`corral.readmodel.codec.encode_hot`) and each finished job asked for.
    hot: bytes | None = None
    finished: list[bytes] = msgspec.field(default_factory=list)


_ASK = msgspec.msgpack.Decoder(AnyAsk)
_REPLY = msgspec.msgpack.Decoder(Reply)
_ENCODER = msgspec.msgpack.Encoder()


def frame(body: bytes) -> bytes:
    return _HEADER.pack(len(body)) + body


def encode_ask(ask: Ask) -> bytes:
    return frame(_ENCODER.encode(ask))


def encode_reply(reply: Reply) -> bytes:
    return frame(_ENCODER.encode(reply))


def decode_ask(body: bytes) -> Ask:
    """The request in `body`; GatewayRefusal MALFORMED naming what is wrong."""
    try:
        ask: Ask = _ASK.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise GatewayRefusal("MALFORMED", f"not a gateway request: {exc}") from None
    return ask


def decode_reply(body: bytes) -> Reply:
    try:
        return _REPLY.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise GatewayRefusal("MALFORMED", f"not a gateway reply: {exc}") from None


async def read_frame(reader: asyncio.StreamReader, limit: int) -> bytes:
    """One frame's body; FrameTooLarge (before reading it) when it announces more than `limit`
    bytes, asyncio.IncompleteReadError when the peer closes mid-frame."""
    size = _HEADER.unpack(await reader.readexactly(_HEADER.size))[0]
    if size > limit:
        raise FrameTooLarge(size, limit)
    return await reader.readexactly(size)


# ---- who is asking -------------------------------------------------------------------------------
def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected unix socket, as the kernel recorded
    it at connect (`SO_PEERCRED`): the client cannot choose it."""
    _pid, uid, _gid = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    return int(uid)


def account_of(uid: int, lookup: Callable[[int], pwd.struct_passwd] = pwd.getpwuid) -> str:
    """The account name of `uid` on this host (uid 0 is `root`, a person like any other here: being
    an admin is the registry's word, not the uid's). GatewayRefusal when the uid has no name or one
    the bus cannot carry."""
    try:
        name = lookup(uid).pw_name
    except KeyError:
        raise GatewayRefusal("NO_ACCOUNT", f"uid {uid} has no account name on this host (getpwuid): "
                                           "the gateway records people by name") from None
    if not _ACCOUNT.match(name):
        raise GatewayRefusal("BAD_ACCOUNT", f"account {name!r} (uid {uid}) cannot be a Corral user name: use "
                                            "letters, digits, '.', '_' or '-' (at most 64), or get a credential "
                                            "from an admin (`corral user add`)")
    return name


def as_account(data: bytes, account: str) -> Event:
    """The request in `data` with its user and actor set to `account`: GatewayRefusal when it is no
    contract event or not a user request (`USER_REQUEST_TYPES`)."""
    try:
        event = decode(data)
    except ContractError as exc:
        raise GatewayRefusal("MALFORMED", f"not a Corral request: {exc}") from None
    if event.type not in USER_REQUEST_TYPES:
        raise GatewayRefusal("NOT_A_USER_REQUEST", f"{event.type} is not a person's request; the gateway "
                                                   f"carries {', '.join(USER_REQUEST_TYPES)}")
    return msgspec.structs.replace(event, user=account, actor=f"user/{account}")


def message_id(event: Event, key: bytes = b"") -> str:
    """The NATS message id of a request the gateway publishes: a submission id is scoped to the
    account (`submission_msg_id`, keyed by the gateway's `key`: another account's equal id never
    deduplicates this one away, nor can be claimed ahead of it), anything else is its event id."""
    submission = getattr(event, "submission_id", None) or getattr(getattr(event, "spec", None), "submission_id", None)
    user = getattr(event, "user", None)
    return submission_msg_id(user, submission, key) if submission and user else event.event_id
