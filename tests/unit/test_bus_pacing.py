"""A linger is taken while messages come often enough for it to gather some, and not on a quiet bus."""

from __future__ import annotations

import pytest

from corral.bus.pacing import GATHERS, HORIZON, Linger


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_quiet_bus_takes_no_wait() -> None:
    clock = _Clock()
    linger = Linger(0.02, clock=clock)
    for _ in range(10):  # a job's few events every half second
        assert linger.after(2) == 0.0
        clock.now += 0.5
    assert not linger.busy()


def test_a_stream_of_messages_takes_the_wait_and_a_quiet_spell_ends_it() -> None:
    clock = _Clock()
    linger = Linger(0.02, clock=clock)
    waits = []
    for _ in range(300):  # 300 messages a second, for 3 s
        waits.append(linger.after(3))
        clock.now += 0.01
    assert waits[-1] == 0.02 and linger.busy()
    assert linger.rate() == pytest.approx(300, rel=0.5)
    clock.now += 5 * HORIZON
    assert not linger.busy()
    assert linger.after(1) == 0.0  # the first message after the spell passes at once


def test_the_wait_is_taken_from_the_rate_it_would_gather_at() -> None:
    clock = _Clock()
    linger = Linger(0.01, clock=clock)
    linger.after(int(GATHERS / 0.01 * HORIZON) - 1)
    assert not linger.busy()
    linger.after(1)
    assert linger.busy()


def test_no_linger_never_waits() -> None:
    linger = Linger(0.0)
    assert linger.after(10_000) == 0.0 and not linger.busy()


def test_a_negative_linger_is_refused() -> None:
    with pytest.raises(ValueError, match="linger"):
        Linger(-0.01)
