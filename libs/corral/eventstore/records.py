"""The records the event store reads and writes, kept generic on purpose.

Why: the store must not know the contract classes (they evolve separately, in `corral.contracts`).
A service adapts a contract event to a `NewEvent` in one line (envelope fields map one to one and
`data` is the encoded event), and the store stays a plain, well-tested log of JSON payloads.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal


class AnyVersion(enum.Enum):
    """Type of the `ANY` sentinel: append without an optimistic concurrency check."""

    ANY = "any"


ANY: Final = AnyVersion.ANY
"""Pass as `expected_version` to append whatever the stream's current version is."""

ExpectedVersion = int | Literal[AnyVersion.ANY]
"""How many events the caller believes the stream holds (0 for a new stream), or `ANY`."""


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event about to be appended. `data` is the JSON-encoded event (stored byte for byte)."""

    event_id: str
    stream: str
    type: str
    schema_version: int
    data: bytes
    correlation_id: str | None
    causation_id: str | None
    occurred_at: datetime

    def __post_init__(self) -> None:
        # Bad input is refused here, naming the field, rather than deep inside a SQL error.
        for name in ("event_id", "stream", "type"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"NewEvent.{name} must be a non-empty string, got {value!r}")
        if not isinstance(self.schema_version, int) or self.schema_version < 1:
            raise ValueError(f"NewEvent.schema_version must be an int >= 1, got {self.schema_version!r}")
        if not isinstance(self.data, bytes | bytearray | memoryview):
            raise ValueError(f"NewEvent.data must be JSON bytes, got {type(self.data).__name__}; "
                             "encode the event first (e.g. msgspec.json.encode)")
        if not isinstance(self.occurred_at, datetime) or self.occurred_at.tzinfo is None:
            raise ValueError(f"NewEvent.occurred_at must be a timezone-aware datetime, got "
                             f"{self.occurred_at!r}; use datetime.now(UTC)")


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """An event as the log holds it.

    `version` is its 1-based place in its stream; `position` its place in the global log, which is
    gapless and assigned in commit order (see `corral.eventstore.store`), so a reader that saw
    position N has seen every event before N.
    """

    event_id: str
    stream: str
    type: str
    schema_version: int
    data: bytes
    correlation_id: str | None
    causation_id: str | None
    occurred_at: datetime
    version: int
    position: int
    recorded_at: datetime
    #: The W3C `traceparent` of the append (None unless the appender traced): telemetry, not part of
    #: the event or of the hash chain; the relay publishes it (see `corral.telemetry.tracing`).
    trace_context: str | None = None


@dataclass(frozen=True, slots=True)
class Tracking:
    """Marks an append as the one effect of `consumer` handling the message identified by `key`.

    Written in the same transaction as the events, unique per (consumer, key): a redelivered
    message finds its key already recorded and the append becomes `AlreadyProcessed`.
    """

    consumer: str
    key: str

    def __post_init__(self) -> None:
        if not self.consumer or not self.key:
            raise ValueError(f"Tracking needs a non-empty consumer and key, got {self!r}")


@dataclass(frozen=True, slots=True)
class AlreadyProcessed:
    """The value an append with `tracking` returns when that message was handled before.

    Not an exception: a redelivery is expected, and the caller simply acknowledges it.
    """

    consumer: str
    key: str
