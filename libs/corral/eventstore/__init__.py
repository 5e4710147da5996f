"""Postgres event store: append-only streams, optimistic concurrency, a commit-ordered global log.

See `corral.eventstore.store` for the ordering guarantee and idempotency rules.
"""

from corral.eventstore.errors import (
    ConcurrencyError,
    DuplicateEvent,
    EventStoreError,
    InvalidEventData,
    MigrationError,
)
from corral.eventstore.records import (
    ANY,
    AlreadyProcessed,
    AnyVersion,
    ExpectedVersion,
    NewEvent,
    StoredEvent,
    Tracking,
)
from corral.eventstore.store import EventStore

__all__ = [
    "ANY",
    "AlreadyProcessed",
    "AnyVersion",
    "ConcurrencyError",
    "DuplicateEvent",
    "EventStore",
    "EventStoreError",
    "ExpectedVersion",
    "InvalidEventData",
    "MigrationError",
    "NewEvent",
    "StoredEvent",
    "Tracking",
]
