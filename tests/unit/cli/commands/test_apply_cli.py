"""`corral apply` end to end over a fake client: what it prints (stdout, stderr, `--json`) and its
exit code, for a change applied, refused before sending, and not waited for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from corral.cli import cluster as cluster_cli
from corral.cli import session
from corral.cli.main import app
from corral.stack.context import Context
from tests.unit.cli.commands.fakes import FakeClient
from tests.unit.cli.commands.logs import queues


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    fake = FakeClient(queues())

    async def connect(ctx: Context, **_: Any) -> FakeClient:
        return fake

    monkeypatch.setattr(session, "context", lambda **_: Context(nats_url="nats://x", postgres_dsn="postgresql://x"))
    monkeypatch.setattr(session, "connect", connect)
    monkeypatch.setattr(cluster_cli, "require_admin", lambda action: None)
    return fake


def corral(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def test_an_applied_change_prints_its_version_and_json_its_fields(client: FakeClient, tmp_path: Path) -> None:
    file = tmp_path / "q.yaml"
    file.write_text("queues: [{name: team-a, guaranteed_gpus: 4}]\n")
    shown = corral("apply", str(file), "-m", "more")
    assert shown.exit_code == 0, shown.output
    assert "Applied 1 queues: team-a (queue tree v1)" in shown.stdout
    out = json.loads(corral("apply", str(file), "--json").stdout)
    assert {k: out[k] for k in ("applied", "version", "rollback_of", "evidence", "verdict", "request")} == {
        "applied": ["team-a"], "version": 2, "rollback_of": None, "evidence": [], "verdict": "done",
        "request": "QueueTreeApplied"}
    pending = json.loads(corral("apply", str(file), "--no-wait", "--json").stdout)
    assert pending == {"applied": ["team-a"], "version": 3, "rollback_of": None, "evidence": []}


def test_a_file_that_cannot_be_applied_says_each_problem_and_exits_1(client: FakeClient, tmp_path: Path) -> None:
    file = tmp_path / "q.yaml"
    file.write_text("queues: [{name: team-a, guaranteed_gpus: -1}]\n")
    shown = corral("apply", str(file))
    assert shown.exit_code == 1 and client.sent == []
    assert "is not a valid queues file:" in shown.stderr and "queues[0].guaranteed_gpus" in shown.stderr
    bad_gate = corral("apply", str(file), "--require", "nonsense")
    assert bad_gate.exit_code == 1 and bad_gate.stderr.startswith("error: ") and client.sent == []
