from __future__ import annotations

from pathlib import Path

from corral.services.node_agent.restart_policy import FailJob, RestartGang, decide_restart


def test_crash_restarts_the_gang_from_its_last_checkpoint_while_restarts_remain() -> None:
    decision = decide_restart(attempt=2, restarts=0, max_restarts=2, last_checkpoint=Path("/c/step-7"),
                              failed_rank=1, exit_code=3)
    assert decision == RestartGang(attempt=3, restarts=1, resume_from=Path("/c/step-7"))


def test_crash_without_any_checkpoint_restarts_from_scratch() -> None:
    decision = decide_restart(attempt=1, restarts=0, max_restarts=1, last_checkpoint=None,
                              failed_rank=0, exit_code=1)
    assert decision == RestartGang(attempt=2, restarts=1, resume_from=None)


def test_job_fails_once_max_restarts_are_used() -> None:
    decision = decide_restart(attempt=3, restarts=2, max_restarts=2, last_checkpoint=Path("/c"),
                              failed_rank=5, exit_code=-9)
    assert isinstance(decision, FailJob)
    assert decision.code == "restarts_exhausted"
    assert "rank 5 exited with code -9" in decision.message


def test_zero_max_restarts_fails_on_the_first_crash() -> None:
    decision = decide_restart(attempt=1, restarts=0, max_restarts=0, last_checkpoint=None,
                              failed_rank=0, exit_code=None)
    assert isinstance(decision, FailJob)
    assert "could not start" in decision.message
