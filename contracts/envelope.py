"""The envelope every event carries, event ids, and stream names.

Why an envelope: the event store, the bus and every consumer handle events generically (append
to a stream, dedupe on `event_id`, trace a job through `correlation_id`/`causation_id`) without
knowing payloads. Events are flat frozen Structs: envelope fields first, then the payload, and
the JSON key `type` (a msgspec tag) names the class, so a decoder can pick the class before
validating the rest.

Randomness and the clock are allowed here (ids, `occurred_at`), never in the scheduling core.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Annotated, Any, Self

import msgspec

from corral.contracts.decoding import validated

__all__ = [
    "CLUSTER_STREAM",
    "POLICY_STREAM",
    "QUEUE_GATE_STREAM",
    "QUEUE_TREE_STREAM",
    "Event",
    "EventId",
    "Reason",
    "UtcDatetime",
    "job_stream",
    "new_event_id",
    "node_stream",
    "queue_stream",
]

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
#: ten bits -> their two Crockford digits; a ULID's 130 bits (the top two zero) are 13 pairs
_DIGIT_PAIRS = [high + low for high in _CROCKFORD for low in _CROCKFORD]
_PAIR_SHIFTS = tuple(range(120, -1, -10))
_ULID_PATTERN = "^[0-7][0-9A-HJKMNP-TV-Z]{25}$"

EventId = Annotated[str, msgspec.Meta(pattern=_ULID_PATTERN, description="ULID: 26 Crockford base32 "
                                      "characters, lexicographically sortable by creation time")]
UtcDatetime = Annotated[datetime, msgspec.Meta(tz=True, description="RFC 3339 timestamp with offset")]
NonEmpty = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]

CLUSTER_STREAM = "cluster"


def job_stream(job_id: str) -> str:
    return f"job-{job_id}"


def node_stream(node: str) -> str:
    return f"node-{node}"


def queue_stream(queue: str) -> str:
    return f"queue-{queue}"


#: The numbered versions of the whole queue tree (QueueTreeApplied): stream version N = config
#: version N. Not under the `queue-` prefix, which is one stream per queue (names cannot collide).
QUEUE_TREE_STREAM = "queues"
#: Changes the evidence gate refused (QueueChangeRefused).
QUEUE_GATE_STREAM = "queues-gate"
#: The scheduling policy in force (PolicyInForce), one version per change.
POLICY_STREAM = "policy"


def new_event_id(now: datetime | float, rand: bytes | None = None) -> str:
    """A ULID: 48-bit milliseconds since the epoch + 80 random bits, Crockford base32.

    Sorting ids as strings sorts them by creation millisecond, which keeps JetStream dedupe
    ids and log reads readable; pass `rand` (10 bytes) to make ids reproducible in tests.
    """
    seconds = now.timestamp() if isinstance(now, datetime) else float(now)
    millis = int(seconds * 1000)
    if not 0 <= millis < 1 << 48:
        raise ValueError(f"time {now!r} is outside the ULID range (1970 .. 10889)")
    if rand is None:
        rand = os.urandom(10)
    if len(rand) != 10:
        raise ValueError(f"rand must be 10 bytes, got {len(rand)}")
    value = (millis << 80) | int.from_bytes(rand, "big")
    # two base32 digits (ten bits) at a time: every event of every service gets one
    return "".join([_DIGIT_PAIRS[(value >> shift) & 1023] for shift in _PAIR_SHIFTS])


def event_id_time(event_id: str) -> datetime:
    """The millisecond a ULID `event_id` was made (by its sender: for a request, when the client
    sent it; `occurred_at` of a recorded request is when the service received it)."""
    value = 0
    for char in event_id[:10]:
        value = value * 32 + _CROCKFORD.index(char)
    return datetime.fromtimestamp(value / 1000, UTC)


_VERSIONS: dict[type, int] = {}


class Reason(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Why something happened or is waiting: a stable `code`, a human message with numbers, details."""

    code: Annotated[str, msgspec.Meta(pattern="^[A-Z][A-Z0-9_]*$", description="UPPER_SNAKE code")]
    message: str
    details: dict[str, Any] = msgspec.field(default_factory=dict)


class Event(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True,
            tag_field="type", tag=True):
    """Base of every event. Subclasses add payload fields (and must pass `kw_only=True`).

    `schema_version` is the class's version: its default. A v2 of an event redeclares
    `schema_version: int = 2` and sets `tag="<Name>"` so the wire `type` stays the same.
    """

    event_id: EventId
    schema_version: int = 1
    occurred_at: UtcDatetime
    stream: NonEmpty
    correlation_id: NonEmpty
    causation_id: EventId | None = None
    actor: NonEmpty

    def __post_init__(self) -> None:
        version = type(self).version()
        if self.schema_version != version:
            raise ValueError(f"schema_version {self.schema_version} is not {self.type} v{version}")

    @property
    def type(self) -> str:
        """The wire `type`: the class name (or the explicit tag of a versioned class)."""
        return type(self).type_name()

    @classmethod
    def type_name(cls) -> str:
        tag = cls.__struct_config__.tag
        return tag if isinstance(tag, str) else cls.__name__

    @classmethod
    def version(cls) -> int:
        """The class's schema_version (its default), cached: every decode checks it."""
        version = _VERSIONS.get(cls)
        if version is None:
            # The field's default read from the class itself: `msgspec.structs.fields` resolves
            # every annotation of the class (the registry asks each event class at import).
            names, defaults = cls.__struct_fields__, cls.__struct_defaults__
            version = _VERSIONS[cls] = int(defaults[names.index("schema_version") - len(names) + len(defaults)])
        return version

    @classmethod
    def new(
        cls,
        *,
        stream: str,
        actor: str,
        causation: Event | None = None,
        correlation_id: str | None = None,
        now: datetime | None = None,
        event_id: str | None = None,
        **payload: Any,
    ) -> Self:
        """Create a validated event, filling the envelope.

        `correlation_id` defaults to the causing event's, else to this event's own id (a root).
        `now` defaults to the wall clock (a naive datetime is taken as UTC); `event_id` to a new ULID.
        The result is checked against the contract (a round trip), so a bad payload fails here,
        at the producer, with a ContractError naming the field, instead of at every consumer.
        """
        at = now or datetime.now(UTC)
        # a naive `now` is taken as UTC (never as the machine's local time)
        at = at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
        eid = event_id or new_event_id(at)
        if correlation_id is None:
            correlation_id = causation.correlation_id if causation is not None else eid
        event = cls(
            event_id=eid,
            occurred_at=at,
            stream=stream,
            correlation_id=correlation_id,
            causation_id=causation.event_id if causation is not None else None,
            actor=actor,
            **payload,
        )
        return validated(event)
