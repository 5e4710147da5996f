"""Restarts of `corral up`'s children back off exponentially, capped, and are forgiven when stable."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from corral.stack.backoff import RestartBackoff


def test_a_crash_loop_backs_off_exponentially_up_to_the_cap() -> None:
    b = RestartBackoff(initial=0.5, cap=30.0, stable_after=60.0)
    now, delays = 0.0, []
    b.started(now)
    for _ in range(10):
        now += 0.1  # dies at once, as placement did during a Postgres outage
        delays.append(b.exited(now))
        assert not b.due(now + delays[-1] - 0.01) and b.due(now + delays[-1])
        now += delays[-1]
        b.started(now)
    assert delays[:7] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0]
    assert max(delays) == 30.0


def test_a_stable_period_forgives_earlier_crashes() -> None:
    b = RestartBackoff(initial=0.5, cap=30.0, stable_after=60.0)
    b.started(0.0)
    for i in range(5):
        b.exited(1.0 + i)
        b.started(1.0 + i)
    b.started(100.0)
    assert b.exited(161.0) == 0.5


@given(st.lists(st.floats(min_value=0.0, max_value=500.0), min_size=1, max_size=50))
def test_every_delay_is_positive_and_at_most_the_cap(runs: list[float]) -> None:
    b = RestartBackoff(initial=0.5, cap=30.0, stable_after=60.0)
    now = 0.0
    for run in runs:
        b.started(now)
        now += run
        delay = b.exited(now)
        assert 0.5 <= delay <= 30.0
        now += delay
