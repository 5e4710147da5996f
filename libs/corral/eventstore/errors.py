"""Typed errors of the event store.

`ConcurrencyError` is the expected outcome of a lost optimistic race and carries what the caller
needs to retry (re-read the stream, decide again). The rest signal misuse or a broken database.
"""

from __future__ import annotations


class EventStoreError(Exception):
    """Base class of every error raised by `corral.eventstore`."""


class ConcurrencyError(EventStoreError):
    """`stream` holds `actual` events, not the `expected` the caller based its decision on.

    Nothing of the append (or of the whole multi-stream append) was written.
    """

    def __init__(self, stream: str, expected: int, actual: int) -> None:
        super().__init__(f"stream {stream!r}: expected version {expected}, actual {actual}; "
                         "re-read the stream and decide again")
        self.stream = stream
        self.expected = expected
        self.actual = actual


class DuplicateEvent(EventStoreError):
    """Some (not all) of the appended event ids are already stored, or stored in another stream.

    A complete replay of an earlier append is not an error (it is an idempotent no-op); a partial
    overlap means two different appends reuse ids, which is a bug in the caller.
    """

    def __init__(self, event_ids: list[str]) -> None:
        super().__init__(f"event ids already stored by a different append: {', '.join(event_ids)}; "
                         "every event needs a fresh, unique event_id")
        self.event_ids = event_ids


class InvalidEventData(EventStoreError):
    """An event's `data` is not valid JSON (the database column is `json`)."""


class MigrationError(EventStoreError):
    """A migration failed, or an applied migration file was edited afterwards."""
