"""`corral logs` reads only the job's own log directory (never, say, /etc/shadow read as root)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli.main import app
from corral.job_logs import LogsRefused, job_log_files, split_attempts


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    logs = tmp_path / "logs"
    (logs / "workers" / "j1").mkdir(parents=True)
    (logs / "workers" / "j1" / "rank-0.log").write_text("hello from rank 0\n")
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "rank-0.log").write_text("SECRET\n")
    return logs


def _logs(log_dir: Path, job: str) -> tuple[int, str]:
    env = {"CORRAL_NATS_URL": "nats://127.0.0.1:1", "CORRAL_POSTGRES_DSN": "postgresql://x@127.0.0.1:1/x",
           "CORRAL_LOG_DIR": str(log_dir), "CORRAL_CONTEXT": str(log_dir / "none.json")}
    result = CliRunner().invoke(app, ["logs", job, "--local"], env=env)  # the bus: tests/e2e/test_logs_anywhere.py
    return result.exit_code, result.output


def test_own_job_logs_are_printed(log_dir: Path) -> None:
    code, out = _logs(log_dir, "j1")
    assert code == 0 and "hello from rank 0" in out


@pytest.mark.parametrize("job", ["../../secret", "../secret", "/etc", "PLACEHOLDER_ABS", "j1/../../../secret"])
def test_a_path_instead_of_a_job_id_is_refused(log_dir: Path, job: str) -> None:
    if job == "PLACEHOLDER_ABS":
        job = str(log_dir.parent / "secret")
    assert isinstance(job_log_files(log_dir, job), LogsRefused)
    code, out = _logs(log_dir, job)
    said = " ".join(out.split())  # the error wraps at the terminal's width, wherever the path ends
    assert code != 0 and "SECRET" not in out and "not a job id" in said, out


def test_a_symlinked_log_file_is_not_followed(log_dir: Path) -> None:
    job = log_dir / "workers" / "j2"
    job.mkdir()
    (job / "rank-0.log").symlink_to(log_dir.parent / "secret" / "rank-0.log")
    assert job_log_files(log_dir, "j2") == []
    _, out = _logs(log_dir, "j2")
    assert "SECRET" not in out


def test_a_symlinked_job_directory_is_not_followed(log_dir: Path) -> None:
    (log_dir / "workers" / "j3").symlink_to(log_dir.parent / "secret")
    (log_dir / "j3").symlink_to(log_dir.parent / "secret")
    assert job_log_files(log_dir, "j3") == []
    _, out = _logs(log_dir, "j3")
    assert "SECRET" not in out


def test_a_rank_file_splits_into_its_attempts() -> None:
    text = ("old agent line\n==== corral job j1 attempt 0 rank 0 node_rank 0 started x ====\na\n"
            "==== exited with code 3 ====\n==== corral job j1 attempt 1 rank 0 node_rank 0 started y ====\nb\n")
    parts = split_attempts(text, "j1")
    assert parts[None] == ["old agent line"]
    assert parts[0][1:] == ["a", "==== exited with code 3 ===="] and parts[1][1:] == ["b"]


def test_local_logs_show_each_attempt_apart(log_dir: Path) -> None:
    (log_dir / "workers" / "j4").mkdir()
    (log_dir / "workers" / "j4" / "rank-1.log").write_text(
        "==== corral job j4 attempt 0 rank 1 x ====\nfirst\n==== corral job j4 attempt 1 rank 1 y ====\nsecond\n")
    env = {"CORRAL_NATS_URL": "nats://127.0.0.1:1", "CORRAL_LOG_DIR": str(log_dir),
           "CORRAL_CONTEXT": str(log_dir / "none.json")}
    result = CliRunner().invoke(app, ["logs", "j4", "--local", "--attempt", "1", "--json"], env=env)
    assert result.exit_code == 0, result.output
    assert '"second"' in result.output and '"first"' not in result.output and '"rank": 1' in result.output
