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
