"""The stepd host waits on every hosted rank's pipe at once: a node's worth of gangs (one agent
process can serve many simulated nodes) holds fd numbers past select's 1024."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from corral.services.node_agent.process import stepd_host


def test_the_host_waits_on_descriptors_numbered_past_1024() -> None:
    r, w = os.pipe()
    high = 1500
    os.dup2(r, high)
    host = stepd_host.Host(stepd_host.GangLog(), env={})
    host.watch(high)
    try:
        assert host.ready(0.0) == []
        os.write(w, b"x")
        assert host.ready(1.0) == [high]
    finally:
        for fd in (r, w, high):
            os.close(fd)


def test_a_bug_starting_one_gang_ends_that_gang_failed_and_not_the_host(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from corral.services.node_agent.process import stepd
    from corral.services.node_agent.process.assignment import Assignment, RankAssignment
    from corral.services.node_agent.process.step_files import LAUNCH, Launch, read_state, write_json

    a = Assignment(job_id="j1", attempt=0, world_size=1, node_rank=0, master_addr="127.0.0.1", master_port=29500,
                   ranks=(RankAssignment(0, 0, (0,)),), command=("true",), checkpoint_dir=tmp_path / "ckpt",
                   log_dir=tmp_path / "logs")
    write_json(tmp_path / LAUNCH, Launch(assignment=a, cause=None, kill_grace=1.0, launched_at=0.0).to_json())

    def broken(self: stepd.Stepd, rank: int) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(stepd.Stepd, "spawn", broken)
    gang_log = stepd_host.GangLog()
    logger = logging.getLogger("corral.stepd")
    logger.addHandler(gang_log)  # as the host's root handler
    try:
        host = stepd_host.Host(gang_log)
        assert host.add(tmp_path) is None  # answered: the agent follows the gang's files
    finally:
        logger.removeHandler(gang_log)
    state = read_state(tmp_path)
    assert state is not None and state["phase"] == "ended" and state["end"] == "failed"
    assert not host.gangs
    assert "a bug" in (tmp_path / "stepd.log").read_text()


def _launch(folder: Path, job: str, command: tuple[str, ...]) -> None:
    from corral.services.node_agent.process.assignment import Assignment, RankAssignment
    from corral.services.node_agent.process.step_files import LAUNCH, Launch, write_json

    folder.mkdir(parents=True)
    a = Assignment(job_id=job, attempt=0, world_size=1, node_rank=0, master_addr="127.0.0.1", master_port=29500,
                   ranks=(RankAssignment(0, 0, (0,)),), command=command, checkpoint_dir=folder / "ckpt",
                   log_dir=folder.parent / "logs")
    write_json(folder / LAUNCH, Launch(assignment=a, cause=None, kill_grace=1.0, launched_at=0.0).to_json())


def test_a_rank_that_exits_runs_its_own_gang_at_once_and_a_child_of_nobody_is_reaped(tmp_path: Path) -> None:
    import time

    from corral.services.node_agent.process.step_files import read_state

    host = stepd_host.Host(stepd_host.GangLog(), env={"PATH": os.defpath})
    _launch(tmp_path / "quick", "quick", ("true",))
    _launch(tmp_path / "slow", "slow", ("sleep", "30"))
    assert host.add(tmp_path / "quick") is None and host.add(tmp_path / "slow") is None
    stray = os.fork()
    if stray == 0:
        os._exit(0)
    forked = {stray}
    deadline = time.monotonic() + 10
    while len(host.gangs) == 2 and time.monotonic() < deadline:
        time.sleep(0.02)
        host.reap(time.monotonic(), forked)  # no due time has come: only the exit runs a gang
    try:
        quick = read_state(tmp_path / "quick")
        assert quick is not None and quick["phase"] == "ended" and quick["end"] == "completed"
        assert [g.a.job_id for g in host.gangs] == ["slow"]
        while forked and time.monotonic() < deadline:
            time.sleep(0.02)
            host.reap(time.monotonic(), forked)
        assert not forked
        with pytest.raises(ChildProcessError):
            os.waitpid(stray, os.WNOHANG)
    finally:
        for gang in host.gangs:
            for proc in gang.procs.values():
                proc.kill()
                proc.wait()
