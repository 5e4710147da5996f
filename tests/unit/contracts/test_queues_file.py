"""queues.yaml describes a queue tree that the fair-share core can actually honour."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.contracts import QueueSpec, SpecError, load_queues_file, load_queues_text, validate_queues

QUEUES_YAML = """
queues:
  - {name: research, guaranteed_gpus: 24, max_gpus: 32}
  - {name: research/nlp, guaranteed_gpus: 16, max_gpus: 32, weight: 2}
  - {name: research/vision, guaranteed_gpus: 8, lend_limit: 4}
  - {name: prod/serving, guaranteed_gpus: 8}
"""


def problems_of(queues: list[dict[str, object]]) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        validate_queues({"queues": queues})
    return {p.path: p.message for p in info.value.problems}


def test_queues_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "queues.yaml"
    path.write_text(QUEUES_YAML)
    queues = load_queues_file(path)
    assert [q.name for q in queues.queues] == ["research", "research/nlp", "research/vision", "prod/serving"]
    assert queues.queues[1].weight == 2.0
    assert queues.queues[3].max_gpus is None and queues.queues[3].lend_limit is None


def test_implied_parent_guarantees_the_sum_of_its_children() -> None:
    resolved = {q.name: q for q in load_queues_text_resolved(QUEUES_YAML)}
    assert resolved["prod"].guaranteed_gpus == 8
    assert resolved["prod"].max_gpus is None


def load_queues_text_resolved(text: str) -> list[QueueSpec]:
    return load_queues_text(text).resolved()


def test_resolved_tree_lists_parents_before_children() -> None:
    names = [q.name for q in load_queues_text_resolved(QUEUES_YAML)]
    assert names.index("prod") < names.index("prod/serving")
    assert names.index("research") < names.index("research/nlp")


def test_children_cannot_be_guaranteed_more_than_their_parent() -> None:
    found = problems_of([{"name": "a", "guaranteed_gpus": 8},
                         {"name": "a/x", "guaranteed_gpus": 6}, {"name": "a/y", "guaranteed_gpus": 4}])
    assert "guaranteed 10 GPUs but `a` only 8" in found["queues[0].guaranteed_gpus"]


def test_max_below_guarantee_is_rejected() -> None:
    found = problems_of([{"name": "a", "guaranteed_gpus": 8, "max_gpus": 4}])
    assert "below guaranteed_gpus 8" in found["queues[0].max_gpus"]


def test_lend_limit_cannot_exceed_guarantee() -> None:
    found = problems_of([{"name": "a", "guaranteed_gpus": 2, "lend_limit": 3}])
    assert "queues[0].lend_limit" in found


def test_child_ceiling_cannot_exceed_parent_ceiling() -> None:
    found = problems_of([{"name": "a", "guaranteed_gpus": 8, "max_gpus": 8},
                         {"name": "a/x", "guaranteed_gpus": 4, "max_gpus": 16}])
    assert "exceeds its parent's 8" in found["queues[1].max_gpus"]


def test_duplicate_queue_names_are_rejected() -> None:
    found = problems_of([{"name": "a"}, {"name": "a"}])
    assert "queues[1].name" in found


def test_bad_queue_path_names_the_field() -> None:
    with pytest.raises(SpecError) as info:
        validate_queues([{"name": "research//nlp", "guaranteed_gpus": -1, "wieght": 1}])
    found = {p.path: p.hint for p in info.value.problems}
    assert "research/nlp" in found["queues[0].name"]
    assert "queues[0].guaranteed_gpus" in found
    assert found["queues[0].wieght"] == "did you mean `weight`?"


@pytest.mark.parametrize(("written", "seconds"), [("2s", 2.0), ("30m", 1800.0), ("1h30m", 5400.0), ("1.5h", 5400.0),
                                                  ("2d", 172800.0), (90, 90.0), (0.5, 0.5)])
def test_max_wait_is_seconds_or_a_duration_stored_as_seconds(written: object, seconds: float) -> None:
    queue = validate_queues([{"name": "team-a", "max_wait": written}]).queues[0]
    assert queue.max_wait == seconds
    assert QueueSpec(name="team-a").max_wait is None  # never escalated unless set


@pytest.mark.parametrize("written", ["0s", 0, -5, "4 hours", "2x", "h", True])
def test_a_bad_max_wait_names_the_field_and_the_fix(written: object) -> None:
    with pytest.raises(SpecError) as info:
        validate_queues([{"name": "team-a", "max_wait": written}])
    (problem,) = info.value.problems
    assert problem.path == "queues[0].max_wait"
    assert "30m" in problem.hint


def test_a_file_applied_over_the_tree_does_not_imply_a_parent_that_exists() -> None:
    """The review: a file naming only `research/nlp`, applied over a tree with a real `research`
    (guarantee 24, ceiling 32, max_wait), implied a new `research` (guarantee 16, no ceiling)
    that replaced it: the parent lost its ceiling and its other children's room."""
    from corral.contracts.queues import merged_tree, tree_problems

    current = load_queues_text(QUEUES_YAML + "  - {name: research/big, guaranteed_gpus: 0}\n").resolved()
    change = load_queues_text("queues:\n  - {name: research/nlp, guaranteed_gpus: 16, max_gpus: 24}\n")
    resolved = change.resolved(existing={q.name for q in current})
    assert [q.name for q in resolved] == ["research/nlp"]
    whole = {q.name: q for q in merged_tree(current, resolved)}
    assert whole["research"].max_gpus == 32 and whole["research"].guaranteed_gpus == 24
    assert whole["research/nlp"].max_gpus == 24
    # a change that would promise children more than their parent is found in the merged tree
    greedy = load_queues_text("queues:\n  - {name: research/nlp, guaranteed_gpus: 20}\n")
    problems = tree_problems(merged_tree(current, greedy.resolved(existing={q.name for q in current})))
    assert any("children of `research` are guaranteed 28 GPUs" in p.message for p in problems), problems
    # on an empty tree the parent is still implied
    assert [q.name for q in change.resolved()] == ["research", "research/nlp"]


def test_per_user_limits_load_and_a_bad_one_names_the_field_and_the_fix() -> None:
    [q] = validate_queues({"queues": [{"name": "a", "max_submitted_per_user": 500, "max_gpus_per_user": 16,
                                       "submit_rate_per_user": {"per_minute": 60, "burst": 200}}]}).queues
    assert (q.max_submitted_per_user, q.max_gpus_per_user) == (500, 16)
    assert q.submit_rate_per_user is not None and q.submit_rate_per_user.burst == 200
    with pytest.raises(SpecError) as info:
        validate_queues({"queues": [{"name": "a", "max_submitted_per_user": 0, "max_gpus_per_user": -1,
                                     "submit_rate_per_user": {"per_minute": 0, "brust": 3}}]})
    found = {p.path: f"{p.message} / {p.hint}" for p in info.value.problems}
    assert "pending or running" in found["queues[0].max_submitted_per_user"]
    assert "GPUs" in found["queues[0].max_gpus_per_user"]
    assert "submissions a minute" in found["queues[0].submit_rate_per_user.per_minute"]
    assert "burst" in found["queues[0].submit_rate_per_user.brust"]
