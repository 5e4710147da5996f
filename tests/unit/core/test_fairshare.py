"""Fair shares (`corral.core.fairshare`): the figures the metrics and dashboards compare usage with."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.core.fairshare import fair_shares, water_fill
from corral.core.model import QueueConfig
from corral.core.quota import QueueTree


def test_idle_capacity_goes_to_the_queue_that_wants_it_and_guarantees_come_first() -> None:
    tree = QueueTree([QueueConfig("a", 16), QueueConfig("b", 16)], capacity=32)
    assert fair_shares(tree, {"a": 40}) == {"a": 32.0, "b": 0.0}
    assert fair_shares(tree, {"a": 40, "b": 8}) == {"a": 24.0, "b": 8.0}
    assert fair_shares(tree, {"a": 40, "b": 40}) == {"a": 16.0, "b": 16.0}


def test_the_surplus_is_shared_by_weight_and_capped_by_max_gpus() -> None:
    tree = QueueTree([QueueConfig("a", 0, weight=3.0), QueueConfig("b", 0, weight=1.0),
                      QueueConfig("c", 0, max_gpus=2)], capacity=30)
    shares = fair_shares(tree, {"a": 100, "b": 100, "c": 100})
    assert shares["c"] == 2.0
    assert abs(shares["a"] - 21.0) < 1e-6 and abs(shares["b"] - 7.0) < 1e-6


def test_a_subtree_shares_what_its_parent_got() -> None:
    tree = QueueTree([QueueConfig("r", 8), QueueConfig("r/x", 4), QueueConfig("r/y", 4), QueueConfig("p", 8)],
                     capacity=16)
    shares = fair_shares(tree, {"r/x": 10, "r/y": 1, "p": 8})
    assert shares["r"] == 8.0 and shares["p"] == 8.0
    assert shares["r/y"] == 1.0 and shares["r/x"] == 7.0


def test_guarantees_beyond_the_capacity_are_cut_by_weight() -> None:
    tree = QueueTree([QueueConfig("a", 16), QueueConfig("b", 16)], capacity=8)  # nodes lost
    assert fair_shares(tree, {"a": 16, "b": 16}) == {"a": 4.0, "b": 4.0}


names = st.sampled_from(["a", "b", "c", "a/x", "a/y", "b/z"])


@st.composite
def trees(draw: st.DrawFn) -> tuple[QueueTree, dict[str, int]]:
    chosen = sorted(draw(st.sets(names, min_size=1, max_size=6)))
    queues = []
    for name in chosen:
        guarantee = draw(st.integers(0, 16))
        ceiling = draw(st.one_of(st.none(), st.integers(guarantee, 40)))
        queues.append(QueueConfig(name, guarantee, max_gpus=ceiling, weight=draw(st.sampled_from([0.5, 1.0, 2.0]))))
    tree = QueueTree(queues, capacity=draw(st.integers(0, 64)))
    demand = {q.name: draw(st.integers(0, 40)) for q in queues}
    return tree, demand


@settings(max_examples=80, deadline=None)
@given(trees())
def test_shares_never_exceed_a_parents_share_nor_a_demand_and_use_what_is_wanted(case: tuple[QueueTree, dict[str, int]]
                                                                                  ) -> None:
    tree, demand = case
    shares = fair_shares(tree, demand)
    from corral.core.fairshare import subtree_demand

    wanted = subtree_demand(tree, demand)
    for parent, children in tree.children.items():
        given_out = sum(shares[c] for c in children)
        available = tree.capacity if parent == "" else shares[parent]
        assert given_out <= available + 1e-6
        assert given_out >= min(available, sum(wanted[c] for c in children)) - 1e-6  # work-conserving
    for name, share in shares.items():
        assert -1e-9 <= share <= wanted[name] + 1e-6


@given(st.floats(0, 100), st.dictionaries(st.sampled_from("abcd"), st.floats(0, 50), min_size=1))
def test_water_fill_hands_out_min_of_amount_and_caps(amount: float, caps: dict[str, float]) -> None:
    given_out = water_fill(amount, caps, {})
    assert abs(sum(given_out.values()) - min(amount, sum(caps.values()))) < 1e-6
    assert all(given_out[n] <= caps[n] + 1e-9 for n in caps)
