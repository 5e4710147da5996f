"""What-if of a queue-tree change and the evidence gate's criteria (corral.sim.whatif)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.contracts.queues import QueueSpec, merged_tree
from corral.sim.whatif import parse_criterion, what_if


def workload(tmp_path: Path) -> str:
    """Team a floods an 8-GPU node with 4-GPU jobs at t=0; team b asks for the same a second later."""
    lines = [{"name": f"{team}{i}", "queue": team, "replicas": 1, "gpus_per_replica": 4, "runtime": "sim",
              "duration_seconds": 100.0, "submit_at": float(delay)}
             for team, delay in (("a", 0), ("b", 1)) for i in range(4)]
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return f"jsonl:{path}"


EQUAL = [QueueSpec(name="a", guaranteed_gpus=4), QueueSpec(name="b", guaranteed_gpus=4)]
A_FIRST = [QueueSpec(name="a", guaranteed_gpus=8), QueueSpec(name="b", guaranteed_gpus=0)]


def test_the_same_workload_under_two_trees_shows_who_waits_more(tmp_path: Path) -> None:
    result = what_if(workload(tmp_path), "1x8:H100", EQUAL, A_FIRST)
    assert result.jobs == 8
    before, after = result.before, result.after
    assert before["a"].jobs == after["a"].jobs == 4
    # Equal shares: each team runs one job at a time; with a's guarantee at 8, a runs first.
    assert after["a"].avg_wait < before["a"].avg_wait
    assert after["b"].avg_wait > before["b"].avg_wait
    # Equal shares: a borrowed b's half at t=0 and b reclaimed it, so a lost work to preemption;
    # with a's guarantee at 8 nobody reclaims, and a holds exactly its work.
    assert before["a"].preemptions >= 1 and after["a"].preemptions == 0
    assert after["a"].gpu_hours == pytest.approx(4 * 4 * 100 / 3600)
    assert after["a"].gpu_hours < before["a"].gpu_hours
    rows = {r["queue"]: r for r in result.rows()}
    assert rows["b"]["p95_wait_after"] == after["b"].p95_wait and rows["b"]["jobs"] == 4


def test_criteria_check_the_proposed_trees_figures(tmp_path: Path) -> None:
    result = what_if(workload(tmp_path), "1x8:H100", EQUAL, A_FIRST)
    miss = parse_criterion("queue b p95_wait <= 2m").check(result)
    meet = parse_criterion("queue a avg_wait < 1h").check(result)
    assert not miss.passed and miss.after == result.after["b"].p95_wait and miss.threshold == 120
    assert miss.before == result.before["b"].p95_wait
    assert meet.passed
    assert not parse_criterion("queue nobody gpu_hours >= 0").check(result).passed  # no such queue: no evidence


@pytest.mark.parametrize("text, fix", [
    ("b p95_wait <= 2h", "queue NAME METRIC OP VALUE"),
    ("queue b latency <= 2h", "unknown metric 'latency'"),
    ("queue b preemptions <= 2h", "only waits take a unit"),
    ("queue b p95_wait =< 2h", "queue NAME METRIC OP VALUE"),
])
def test_a_criterion_written_wrong_names_the_fix(text: str, fix: str) -> None:
    with pytest.raises(ValueError, match=fix.replace("(", r"\(")):
        parse_criterion(text)


def test_waits_take_units_and_other_metrics_plain_numbers() -> None:
    assert parse_criterion("queue team-a p95_wait <= 2h").threshold == 7200
    assert parse_criterion("queue a/b avg_wait>30").threshold == 30
    assert parse_criterion("queue a preemptions == 0").op == "=="


def test_an_apply_changes_or_adds_queues_and_never_deletes_one() -> None:
    current = [QueueSpec(name="a", guaranteed_gpus=4), QueueSpec(name="a/x", guaranteed_gpus=2),
               QueueSpec(name="c", guaranteed_gpus=1)]
    tree = merged_tree(current, [QueueSpec(name="a", guaranteed_gpus=8), QueueSpec(name="b", guaranteed_gpus=0)])
    assert [(q.name, q.guaranteed_gpus) for q in tree] == [("a", 8), ("b", 0), ("c", 1), ("a/x", 2)]
