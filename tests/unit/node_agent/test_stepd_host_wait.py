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
    try:
        assert stepd_host.ready([high], 0.0) == []
        os.write(w, b"x")
        assert stepd_host.ready([high], 1.0) == [high]
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
