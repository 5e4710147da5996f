from __future__ import annotations

import pytest

from corral.services.node_agent.barrier import GangRunning, GangStartBarrier, ReleaseGang, Waiting


def test_gang_is_running_only_when_every_rank_started() -> None:
    barrier = GangStartBarrier.open(range(4), opened_at=100.0, window_seconds=30.0)
    for rank, at in [(0, 101.0), (2, 102.0), (1, 103.0)]:
        barrier = barrier.with_started(rank, at)
    assert barrier.decide(now=104.0) == Waiting(missing=frozenset({3}), deadline=130.0)
    barrier = barrier.with_started(3, 110.0)
    assert barrier.decide(now=111.0) == GangRunning(running_at=110.0)


def test_window_expiry_releases_the_whole_gang() -> None:
    barrier = GangStartBarrier.open([0, 1], opened_at=0.0, window_seconds=5.0).with_started(0, 1.0)
    verdict = barrier.decide(now=5.0)
    assert isinstance(verdict, ReleaseGang)
    assert verdict.missing == frozenset({1})
    assert "did not start within 5s" in verdict.reason


def test_a_start_reported_after_the_window_does_not_count() -> None:
    barrier = GangStartBarrier.open([0, 1], opened_at=0.0, window_seconds=5.0)
    barrier = barrier.with_started(0, 1.0).with_started(1, 6.0)
    assert isinstance(barrier.decide(now=6.0), ReleaseGang)


def test_a_rank_that_cannot_start_releases_the_gang_at_once() -> None:
    barrier = GangStartBarrier.open([0, 1], opened_at=0.0, window_seconds=60.0).with_started(0, 1.0)
    verdict = barrier.with_start_failed(1, "executable not found").decide(now=2.0)
    assert isinstance(verdict, ReleaseGang)
    assert "executable not found" in verdict.reason


def test_a_repeated_report_keeps_the_first_start_time() -> None:
    barrier = GangStartBarrier.open([0], opened_at=0.0, window_seconds=10.0)
    barrier = barrier.with_started(0, 1.0).with_started(0, 9.0)
    assert barrier.decide(now=9.0) == GangRunning(running_at=1.0)


def test_a_report_for_a_rank_outside_the_gang_is_a_bug() -> None:
    with pytest.raises(ValueError, match="rank 7"):
        GangStartBarrier.open([0, 1], opened_at=0.0, window_seconds=1.0).with_started(7, 0.5)
