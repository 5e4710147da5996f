"""A stepd never dies of a write its disk refuses: the state stays in memory and is written later."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from corral.services.node_agent.process import step_files, stepd
from corral.services.node_agent.process.assignment import Assignment, RankAssignment
from corral.services.node_agent.process.step_files import STATE, Launch


def _stepd(folder: Path) -> stepd.Stepd:
    a = Assignment(job_id="j1", attempt=0, world_size=1, node_rank=0, master_addr="127.0.0.1", master_port=29500,
                   ranks=(RankAssignment(0, 0, (0,)),), command=("true",), checkpoint_dir=folder / "ckpt",
                   log_dir=folder / "logs")
    return stepd.Stepd(folder, Launch(assignment=a, cause=None, kill_grace=1.0, launched_at=0.0))


def test_a_refused_write_keeps_the_state_dirty_and_the_next_one_writes_it(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    s = _stepd(tmp_path)
    real = step_files.append_state
    full = True

    def write(path: Path, content: object) -> None:
        if full:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, content)

    monkeypatch.setattr(stepd, "append_state", write)
    s.state["ranks"]["0"] = {"exit_code": 0, "exited_at": 1.0, "reason": "completed"}
    assert s.save() is False
    assert s.dirty and s.unsaved and not (tmp_path / STATE).exists()
    assert s.timeout(0.0) <= stepd.SAVE_RETRY
    full = False
    assert s.save() is True
    assert not s.dirty and not s.unsaved
    state = step_files.read_state(tmp_path)
    assert state is not None and state["ranks"]["0"]["exit_code"] == 0


def test_a_failed_atomic_write_leaves_no_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(src: object, dst: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(step_files.os, "replace", refuse)
    with pytest.raises(OSError):
        step_files.write_json(tmp_path / STATE, {"a": 1})
    assert list(tmp_path.iterdir()) == []


def test_the_final_state_waits_out_a_full_disk_but_not_a_removed_run_folder(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "attempt-0"
    folder.mkdir()
    s = _stepd(folder)
    real = step_files.append_state
    refusals = iter([True, True, False])

    def write(path: Path, content: object) -> None:
        if next(refusals):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, content)

    monkeypatch.setattr(stepd, "SAVE_RETRY", 0.01)
    monkeypatch.setattr(stepd, "append_state", write)
    assert s.save_final() is True  # a full disk is waited out
    assert (folder / STATE).exists()
    (folder / STATE).unlink()
    folder.rmdir()
    monkeypatch.setattr(stepd, "append_state", real)
    assert s.save_final() is False  # a removed folder is not: the stepd ends instead of retrying forever
