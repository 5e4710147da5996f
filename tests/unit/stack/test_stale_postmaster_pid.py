"""A `postmaster.pid` left by a crashed Postgres never blocks the next start, and a live one is
never removed from under a Postgres on the same directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from corral.stack.servers import clear_stale_postmaster_pid


def write_pid(pgdata: Path, pid: int) -> Path:
    pgdata.mkdir(parents=True, exist_ok=True)
    path = pgdata / "postmaster.pid"
    path.write_text(f"{pid}\n{pgdata}\n1700000000\n5432\n")
    return path


def test_a_pid_file_of_a_gone_process_is_removed(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    path = write_pid(tmp_path / "pgdata", gone.pid)
    assert "is gone" in clear_stale_postmaster_pid(tmp_path / "pgdata")
    assert not path.exists()


def test_a_pid_file_naming_a_zombie_child_is_reaped_and_removed(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    # not waited for: a zombie, the case Postgres itself refused ("lock file already exists")
    path = write_pid(tmp_path / "pgdata", child.pid)
    assert clear_stale_postmaster_pid(tmp_path / "pgdata", child)
    assert not path.exists() and child.returncode == 0


def test_a_pid_reused_by_another_program_is_not_a_postgres(tmp_path: Path) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])  # until killed
    try:
        path = write_pid(tmp_path / "pgdata", other.pid)
        assert "is not postgres" in clear_stale_postmaster_pid(tmp_path / "pgdata")
        assert not path.exists() and other.poll() is None  # removed the file, never signalled it
    finally:
        other.kill()
        other.wait()


def test_no_pid_file_nothing_to_do(tmp_path: Path) -> None:
    assert clear_stale_postmaster_pid(tmp_path) == ""
