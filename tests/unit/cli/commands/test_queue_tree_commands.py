"""`corral apply` and `corral queues --history | --diff` as functions over a client: what an apply
asks quota for, the problems that stop it before anything is sent, and the versions' rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral.cli.commands import CommandError
from corral.cli.commands import queue_tree as commands
from corral.contracts import events as ev
from corral.contracts.envelope import queue_stream
from corral.contracts.queues import validate_queues
from corral.verdicts import VerdictKind
from tests.unit.cli.commands.fakes import FakeClient, run
from tests.unit.cli.commands.logs import T0, nodes, queues, submitted


def write(tmp_path: Path, text: str, name: str = "queues.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def apply(c: FakeClient, file: str | None, *, rollback: bool = False, wait: bool = True,
          require: list[str] | None = None) -> commands.Applied:
    return run(commands.apply_tree(c, file, rollback=rollback, message="why", require=require or [], since=T0,
                                   wait=wait, timeout=1))


def test_an_apply_asks_quota_with_the_gates_and_returns_its_verdict(tmp_path: Path) -> None:
    c = FakeClient(queues())
    file = write(tmp_path, "queues:\n  - {name: team-a, guaranteed_gpus: 4}\n"
                           "gates: ['queue team-a p95_wait <= 2h']\n")
    applied = apply(c, file, require=["queue q avg_wait <= 1h"])
    (request,) = c.sent
    assert isinstance(request, ev.QueueTreeApplied) and [q.name for q in request.queues] == ["team-a"]
    assert request.gates == ["queue team-a p95_wait <= 2h"] and request.require == ["queue q avg_wait <= 1h"]
    assert request.what_if_since == T0 and request.message == "why"
    assert applied.verdict is not None and applied.verdict.kind is VerdictKind.DONE
    assert applied.fields() == {"applied": ["team-a"], "version": 1, "rollback_of": None, "evidence": []}


def test_without_waiting_the_version_is_the_next_one(tmp_path: Path) -> None:
    c = FakeClient(queues())
    file = write(tmp_path, "queues:\n  - {name: team-a, guaranteed_gpus: 4}\n")
    apply(c, file)
    applied = apply(c, file, wait=False)
    assert applied.verdict is None and applied.version == 2 and len(c.sent) == 2


def test_a_file_that_cannot_be_applied_is_not_sent(tmp_path: Path) -> None:
    c = FakeClient(queues())
    with pytest.raises(CommandError) as caught:
        apply(c, write(tmp_path, "queues: [{name: team-a, guaranteed_gpus: -1}]\n"))
    assert caught.value.message.endswith("queues.yaml is not a valid queues file:") and c.sent == []
    assert [p.path for p in caught.value.problems] == ["queues[0].guaranteed_gpus"]


def test_a_file_inconsistent_over_the_current_tree_names_the_queue(tmp_path: Path) -> None:
    tree = validate_queues({"queues": [{"name": "big", "guaranteed_gpus": 0, "max_gpus": 4}]}).queues
    c = FakeClient([ev.QueueConfigured.new(stream=queue_stream("big"), actor="t", queue=tree[0], now=T0)])
    with pytest.raises(CommandError) as caught:
        apply(c, write(tmp_path, "queues: [{name: big/one, guaranteed_gpus: 8}]\n"))
    assert caught.value.message.endswith("over the current queue tree (corral queues) would be inconsistent:")
    assert caught.value.problems and all(p.path.startswith("queue big") for p in caught.value.problems)
    assert c.sent == []


def test_a_missing_file_and_nothing_to_roll_back_to_are_said(tmp_path: Path) -> None:
    c = FakeClient(queues())
    with pytest.raises(CommandError, match=r"cannot read .*nope\.yaml"):
        apply(c, str(tmp_path / "nope.yaml"))
    with pytest.raises(CommandError, match="give a queues file"):
        apply(c, None)
    with pytest.raises(CommandError, match="no queue tree version is recorded yet"):
        apply(c, None, rollback=True)
    assert c.sent == []


def test_a_rollback_asks_for_the_earlier_version_as_a_new_one(tmp_path: Path) -> None:
    c = FakeClient(queues())
    apply(c, write(tmp_path, "queues: [{name: team-a, guaranteed_gpus: 4}]\n"))
    with pytest.raises(CommandError, match="only version 1 is recorded"):
        apply(c, None, rollback=True)
    apply(c, write(tmp_path, "queues: [{name: team-a, guaranteed_gpus: 6}]\n"))
    with pytest.raises(CommandError, match=r"--rollback 7: give a version between 1 and 2"):
        apply(c, "7", rollback=True)
    applied = apply(c, None, rollback=True)
    request = c.sent[-1]
    assert isinstance(request, ev.QueueTreeApplied) and request.rollback_of == 1
    assert request.queues[0].guaranteed_gpus == 4 and applied.rollback_of == 1 and applied.version == 3


def test_history_and_diff_of_the_recorded_versions(tmp_path: Path) -> None:
    c = FakeClient(queues())
    apply(c, write(tmp_path, "queues: [{name: team-a, guaranteed_gpus: 4}]\n"))
    apply(c, write(tmp_path, "queues: [{name: team-a, guaranteed_gpus: 6}, {name: team-b, guaranteed_gpus: 1}]\n"))
    history = run(commands.history(c))
    assert [(h["version"], h["changed"], h["message"]) for h in history] == [
        (1, ["team-a"], "why"), (2, ["team-a", "team-b"], "why")]
    diff = run(commands.diff(c, 1, 2))
    assert {"queue": "team-a", "field": "guaranteed_gpus", "before": 4, "after": 6} in diff
    assert {"queue": "team-b", "field": "(queue)", "before": "absent", "after": "present"} in diff
    with pytest.raises(CommandError, match=r"--diff: version 3 does not exist; versions are 1..2"):
        run(commands.diff(c, 1, 3))


@pytest.mark.parametrize(("log", "words"), [
    (lambda: [*queues(), *submitted("a", 10)], "the log holds no registered nodes: nothing to replay the workload on"),
    (lambda: [*queues(), *nodes("1x8:H100")], "the event log holds no admitted submissions to replay"),
])
def test_a_what_if_needs_submissions_and_nodes_in_the_log(tmp_path: Path, log: Any, words: str) -> None:
    c = FakeClient(log())
    with pytest.raises(CommandError) as caught:
        run(commands.what_if(c, write(tmp_path, "queues: [{name: q, guaranteed_gpus: 4}]\n"), rollback=False,
                             message="", require=[], since=T0))
    assert caught.value.message == words and c.sent == []


def test_a_what_if_replays_the_workload_and_checks_the_criteria(tmp_path: Path) -> None:
    c = FakeClient([*queues(), *nodes("1x8:H100"), *submitted("a", 10), *submitted("b", 11)])
    preview = run(commands.what_if(c, write(tmp_path, "queues: [{name: q, guaranteed_gpus: 8}]\n"),
                                   rollback=False, message="", require=["queue q avg_wait <= 0s"], since=T0))
    assert preview.result.jobs == 2 and [ch.criterion for ch in preview.checks] == ["queue q avg_wait <= 0s"]
    assert commands.what_if_json(preview)["jobs"] == 2 and c.sent == []
