"""Pure pieces of the event store: input validation and migration ordering."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from corral.eventstore import MigrationError, NewEvent, Tracking
from corral.eventstore.migrate import Migration, bundled_migrations, ordered


def test_new_event_refuses_bad_fields_naming_them() -> None:
    good = dict(event_id="e", stream="job-1", type="JobSubmitted", schema_version=1, data=b"{}",
                correlation_id=None, causation_id=None, occurred_at=datetime.now(UTC))
    NewEvent(**good)  # type: ignore[arg-type]
    for field, value in [("event_id", ""), ("stream", None), ("schema_version", 0),
                         ("data", "{}"), ("occurred_at", datetime(2026, 1, 1))]:
        with pytest.raises(ValueError, match=f"NewEvent.{field}"):
            NewEvent(**{**good, field: value})  # type: ignore[arg-type]


def test_tracking_needs_a_consumer_and_a_key() -> None:
    with pytest.raises(ValueError, match="Tracking"):
        Tracking("", "k")


def test_migrations_run_in_number_order_not_name_order() -> None:
    files = [Migration("10_b.sql", ""), Migration("9_a.sql", ""), Migration("002_c.sql", "")]
    assert [m.name for m in ordered(files)] == ["002_c.sql", "9_a.sql", "10_b.sql"]


def test_two_migrations_with_one_number_are_refused() -> None:
    with pytest.raises(MigrationError, match="share number 4"):
        ordered([Migration("004_a.sql", ""), Migration("004_b.sql", "")])


def test_a_badly_named_migration_is_refused() -> None:
    with pytest.raises(MigrationError, match=r"NNN_description\.sql"):
        ordered([Migration("events.sql", "")])


def test_the_shipped_migrations_are_found_in_the_package() -> None:
    names = [m.name for m in bundled_migrations()]
    assert names[:3] == ["001_events.sql", "002_consumers.sql", "003_relay_positions.sql"]
