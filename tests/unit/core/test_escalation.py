"""The escalation rule (`corral.core.escalation`): which waits are past their queue's max_wait at a
time T, and that each wait is escalated once, at the first look past its limit."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.core.escalation import Wait, limit_of, next_deadline, overdue, stuck, to_escalate

LIMITS: dict[str, float | None] = {"research": 3600.0, "research/nlp": 600.0, "research/vision": None,
                                   "prod": None, "prod/serving": 60.0}


def test_the_limit_is_the_queues_own_else_the_nearest_ancestors() -> None:
    assert limit_of("research/nlp", LIMITS) == ("research/nlp", 600.0)
    assert limit_of("research/vision", LIMITS) == ("research", 3600.0)  # None: not set, the parent's applies
    assert limit_of("research/vision/big", LIMITS) == ("research", 3600.0)
    assert limit_of("prod", LIMITS) is None
    assert limit_of("unknown", LIMITS) is None


def test_a_wait_is_past_its_limit_only_when_strictly_longer() -> None:
    waits = [Wait("a", "prod/serving", since=100.0), Wait("b", "research/nlp", since=100.0),
             Wait("c", "prod", since=0.0)]
    assert overdue(waits, LIMITS, now=160.0) == []  # exactly 60 s: not longer than max_wait
    (late,) = overdue(waits, LIMITS, now=160.5)
    assert (late.job_id, late.limit_queue, late.max_wait, late.waited, late.past) == \
           ("a", "prod/serving", 60.0, 60.5, 0.5)
    assert [o.job_id for o in overdue(waits, LIMITS, now=1e9)] == ["a", "b"]  # prod sets no limit


def test_an_escalated_wait_is_not_escalated_again() -> None:
    waits = [Wait("a", "prod/serving", since=0.0, escalated_limit=("prod/serving", 60.0)),
             Wait("b", "prod/serving", since=10.0)]
    assert [o.job_id for o in to_escalate(waits, LIMITS, now=100.0)] == ["b"]
    assert [(o.job_id, o.escalated) for o in overdue(waits, LIMITS, now=100.0)] == [("a", True), ("b", False)]


def test_stuck_keeps_a_wait_escalated_under_a_limit_since_removed() -> None:
    waits = [Wait("a", "prod", since=0.0, escalated_limit=("prod/serving", 60.0)),
             Wait("b", "prod/serving", since=50.0)]
    listed = stuck(waits, LIMITS, now=200.0)
    assert [(o.job_id, o.limit_queue, o.max_wait, o.past, o.escalated) for o in listed] == \
           [("a", "prod/serving", 60.0, 140.0, True), ("b", "prod/serving", 60.0, 90.0, False)]
    assert stuck([Wait("c", "prod/serving", since=190.0)], LIMITS, now=200.0) == []


def test_the_next_deadline_is_the_first_unescalated_wait_to_pass_its_limit() -> None:
    waits = [Wait("a", "prod/serving", since=0.0, escalated_limit=("prod/serving", 60.0)),
             Wait("b", "research/nlp", since=100.0), Wait("c", "prod/serving", since=600.0),
             Wait("d", "prod", since=0.0)]
    assert next_deadline(waits, LIMITS) == 660.0
    assert next_deadline([Wait("d", "prod", since=0.0)], LIMITS) is None


QUEUES = ["research/nlp", "research/vision", "prod/serving", "prod"]


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[Wait], list[float], dict[str, float | None]]:
    limits = {q: draw(st.none() | st.floats(1.0, 100.0)) for q in ["research", "prod", *QUEUES]}
    waits = [Wait(f"j{i}", draw(st.sampled_from(QUEUES)), since=draw(st.floats(0.0, 100.0)))
             for i in range(draw(st.integers(0, 8)))]
    looks = sorted(draw(st.lists(st.floats(0.0, 300.0), max_size=20)))
    return waits, looks, limits


@settings(max_examples=150, deadline=None)
@given(histories())
def test_each_wait_is_escalated_once_at_the_first_look_past_its_limit(
        history: tuple[list[Wait], list[float], dict[str, float | None]]) -> None:
    """A service looking at increasing times, recording what `to_escalate` says (as the fold does),
    escalates each wait exactly once if some look is past its limit, never before, never twice."""
    waits, looks, limits = history
    current = {w.job_id: w for w in waits}
    escalated_at: dict[str, list[float]] = {}
    for now in looks:
        for due in to_escalate(current.values(), limits, now):
            escalated_at.setdefault(due.job_id, []).append(now)
            current[due.job_id] = replace(current[due.job_id], escalated_limit=(due.limit_queue, due.max_wait))
    for w in waits:
        limit = limit_of(w.queue, limits)
        past = [t for t in looks if limit is not None and t - w.since > limit[1]]
        assert escalated_at.get(w.job_id, []) == past[:1]
