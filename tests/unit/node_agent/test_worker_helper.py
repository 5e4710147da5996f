from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from corral import worker
from corral.services.node_agent.process.control import CheckpointReport, ControlChannel


def test_checkpoint_signal_sets_the_flag_the_workload_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_CHECKPOINT_SIGNAL", "SIGUSR2")
    monkeypatch.setattr(worker, "_checkpoint_requested", False)
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        assert worker.install() is signal.SIGUSR2
        assert not worker.checkpoint_requested()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert worker.checkpoint_requested()
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_an_unknown_signal_name_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="CORRAL_CHECKPOINT_SIGNAL"):
        worker.signal_from_name("SIGBOGUS")
    assert worker.signal_from_name("usr1") is signal.SIGUSR1


def test_report_reaches_the_agent_through_the_control_file(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    control = tmp_path / "rank-0.control"
    monkeypatch.setenv("CORRAL_CONTROL", str(control))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("CORRAL_ATTEMPT", "2")
    channel = ControlChannel(control)
    assert channel.read_new() == []
    ckpt = tmp_path / "step-12.json"
    worker.atomic_write(ckpt, b'{"step": 12}')
    worker.report_checkpoint(ckpt, 12)
    assert channel.read_new() == [CheckpointReport(rank=0, attempt=2, path=ckpt.resolve(), step=12)]
    assert channel.read_new() == []


def test_agent_ignores_half_written_and_malformed_lines(tmp_path: Path) -> None:
    control = tmp_path / "c"
    channel = ControlChannel(control)
    control.write_bytes(b'not json\n{"kind":"checkpoint","path":"/p","step":3,"rank":1,"attempt":1}')
    assert channel.read_new() == []  # the good record has no newline yet
    with control.open("ab") as handle:
        handle.write(b"\n")
    assert channel.read_new() == [CheckpointReport(rank=1, attempt=1, path=Path("/p"), step=3)]


def test_resume_path_and_checkpoint_dir_come_from_the_environment(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CORRAL_RESUME_FROM", raising=False)
    assert worker.resume_path() is None
    monkeypatch.setenv("CORRAL_RESUME_FROM", "/ckpt/a.pt")
    assert worker.resume_path() == Path("/ckpt/a.pt")
    monkeypatch.setenv("CORRAL_CHECKPOINT_DIR", str(tmp_path / "ck"))
    assert worker.checkpoint_dir() == tmp_path / "ck"
    assert (tmp_path / "ck").is_dir()
