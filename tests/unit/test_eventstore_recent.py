"""`RecentEvents` against its plain definition: the log itself, sliced."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.eventstore.recent import RecentEvents
from corral.eventstore.records import StoredEvent

_AT = datetime(2026, 1, 1, tzinfo=UTC)


def _event(position: int, era: int = 0) -> StoredEvent:
    return StoredEvent(event_id=f"e{era}-{position}", stream="s", type="T", schema_version=1, data=b"{}",
                       correlation_id=None, causation_id=None, occurred_at=_AT, version=position,
                       position=position, recorded_at=_AT)


# A step: read (after, limit) of the log of 200 events, remembered; or look up (after, limit).
_STEPS = st.lists(st.tuples(st.booleans(), st.integers(0, 210), st.integers(1, 60)), max_size=40)


@given(_STEPS, st.integers(1, 80))
@settings(max_examples=300, deadline=None)
def test_what_is_kept_is_the_log_where_it_holds_it(steps: list[tuple[bool, int, int]], kept: int) -> None:
    log = [_event(p) for p in range(1, 201)]
    recent = RecentEvents(kept)
    for read, after, limit in steps:
        if read:
            recent.remember(log[after:after + limit])
        held = recent.after(after, limit)
        assert held == log[after:after + len(held)], "a prefix of what the log holds after `after`"
        assert len(held) <= min(limit, kept)


def test_a_read_that_continues_the_run_extends_it_and_the_oldest_go_first() -> None:
    log = [_event(p) for p in range(1, 31)]
    recent = RecentEvents(kept=20)
    recent.remember(log[0:10])
    recent.remember(log[10:25])
    assert recent.after(10, 100) == log[10:25]
    assert recent.after(5, 3) == log[5:8]
    assert recent.after(4, 100) == []  # position 5 went for room (20 kept)
    assert recent.after(25, 5) == []  # not read yet


def test_an_older_read_leaves_the_newer_run_and_another_log_replaces_it() -> None:
    recent = RecentEvents()
    recent.remember([_event(p) for p in range(50, 60)])
    recent.remember([_event(p) for p in range(1, 5)])  # a reader behind: the newest run stays
    assert recent.after(49, 2) == [_event(50), _event(51)]
    other = [_event(p, era=1) for p in range(55, 58)]  # the same positions, other events: a restored log
    recent.remember(other)
    assert recent.after(54, 10) == other
    assert recent.after(49, 2) == []


def test_events_not_consecutive_are_not_kept() -> None:
    recent = RecentEvents()
    recent.remember([_event(1), _event(3)])
    assert recent.after(0, 5) == []
