"""A supervised child that runs but fails its liveness check is wedged only after its grace, and
only once a check has passed since it started (a child still starting is not wedged)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from corral.stack.liveness import Liveness


def test_failing_checks_after_a_pass_are_wedged_once_the_grace_is_over() -> None:
    live = Liveness(every=2.0, grace=6.0)
    live.started(0.0)
    assert not live.due(1.0) and live.due(2.0)
    assert not live.observe(2.0, True)
    assert [live.observe(t, False) for t in (4.0, 6.0, 8.0, 10.0)] == [False, False, False, True]


def test_a_child_that_never_passed_is_starting_not_wedged() -> None:
    live = Liveness(every=1.0, grace=3.0)
    live.started(0.0)
    assert not any(live.observe(float(t), False) for t in range(1, 100))


def test_a_restart_forgets_the_pass_before_it() -> None:
    live = Liveness(every=1.0, grace=2.0)
    live.started(0.0)
    live.observe(1.0, True)
    live.observe(2.0, False)
    live.started(3.0)
    assert not any(live.observe(float(t), False) for t in range(4, 20))


@given(st.lists(st.tuples(st.floats(0.01, 10.0), st.booleans()), max_size=60), st.floats(0.5, 20.0))
def test_wedged_means_failing_without_a_pass_for_the_grace_after_a_pass(answers: list[tuple[float, bool]],
                                                                         grace: float) -> None:
    live = Liveness(every=1.0, grace=grace)
    live.started(0.0)
    now, passed, failing_since = 0.0, False, None
    for step, ok in answers:
        now += step
        wedged = live.observe(now, ok)
        if ok:
            passed, failing_since = True, None
        elif passed and failing_since is None:
            failing_since = now
        assert wedged == (not ok and passed and failing_since is not None and now - failing_since >= grace)
        assert live.next_at == now + 1.0
