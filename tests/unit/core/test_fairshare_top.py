"""Each queue's fair share (`corral.core.fairshare`), what `corral top` sets usage against."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.core import QueueConfig
from corral.core.fairshare import fair_shares
from corral.core.quota import QueueTree


def shares(queues: list[QueueConfig], capacity: int, demand: dict[str, int]) -> dict[str, float]:
    return {k: round(v, 6) for k, v in fair_shares(QueueTree(queues, capacity), demand).items()}


def test_an_idle_siblings_guarantee_goes_to_the_busy_one_and_comes_back_when_it_wants_it() -> None:
    qs = [QueueConfig("a", guaranteed_gpus=16), QueueConfig("b", guaranteed_gpus=16)]
    assert shares(qs, 32, {"a": 40}) == {"a": 32, "b": 0}
    assert shares(qs, 32, {"a": 40, "b": 8}) == {"a": 24, "b": 8}
    assert shares(qs, 32, {"a": 40, "b": 40}) == {"a": 16, "b": 16}


def test_the_surplus_goes_by_weight_within_ceilings() -> None:
    qs = [QueueConfig("a", weight=3), QueueConfig("b", weight=1), QueueConfig("c", weight=1, max_gpus=2)]
    assert shares(qs, 42, {"a": 100, "b": 100, "c": 100}) == {"a": 30, "b": 10, "c": 2}


def test_a_parent_splits_its_share_among_its_children() -> None:
    qs = [QueueConfig("r", guaranteed_gpus=24), QueueConfig("r/x", guaranteed_gpus=8), QueueConfig("r/y"),
          QueueConfig("s", guaranteed_gpus=8)]
    got = shares(qs, 32, {"r/x": 40, "r/y": 40, "s": 40})
    assert got["r"] == 24 and got["s"] == 8
    assert got["r/x"] == 16 and got["r/y"] == 8  # x: 8 guaranteed + half of the 16 left; y: the other half


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 16), st.integers(1, 4), st.integers(0, 40)), min_size=1, max_size=5),
       st.integers(0, 64))
def test_shares_never_exceed_the_capacity_or_what_a_queue_wants(spec: list[tuple[int, int, int]],
                                                                capacity: int) -> None:
    qs = [QueueConfig(f"q{i}", guaranteed_gpus=g, weight=w) for i, (g, w, _) in enumerate(spec)]
    demand = {f"q{i}": d for i, (_, _, d) in enumerate(spec)}
    got = fair_shares(QueueTree(qs, capacity), demand)
    assert sum(got.values()) <= capacity + 1e-6
    assert all(got[q] <= demand[q] + 1e-6 for q in demand)
    # nothing is left idle while some queue wants more
    if sum(got.values()) < capacity - 1e-6:
        assert all(abs(got[q] - demand[q]) < 1e-6 for q in demand)
