from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from corral.services.node_agent.process.assignment import (
    AGENT_BIN,
    Assignment,
    RankAssignment,
    build_rank_env,
    rank_log_path,
)


def _assignment(**changes: object) -> Assignment:
    base = Assignment(job_id="job-1", attempt=1, world_size=4, node_rank=1, group_world_size=2,
                      master_addr="10.0.0.1",
                      master_port=29500, ranks=(RankAssignment(2, 0, (4, 5)), RankAssignment(3, 1, (6, 7))),
                      command=("python", "train.py"), checkpoint_dir=Path("/ckpt/job-1"),
                      log_dir=Path("/logs"), env={"LR": "0.1"})
    return dataclasses.replace(base, **changes)


def test_rank_env_is_what_torch_distributed_and_corral_worker_expect() -> None:
    a = _assignment()
    env = build_rank_env(a, a.ranks[1], Path("/run/ctl"), {"PATH": "/bin"}, interpreter_bin="/venv/bin")
    assert env == {
        "PATH": "/venv/bin:/bin", "PYTHONUNBUFFERED": "1", "LR": "0.1",
        "CUDA_VISIBLE_DEVICES": "6,7", "NVIDIA_VISIBLE_DEVICES": "6,7",
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
        # torchrun's other variables: node = group, one role named "default", the job is the run
        "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "ROLE_NAME": "default", "ROLE_RANK": "3",
        "ROLE_WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "job-1", "TORCHELASTIC_RESTART_COUNT": "1",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "CORRAL_JOB_ID": "job-1", "CORRAL_CHECKPOINT_DIR": "/ckpt/job-1", "CORRAL_ATTEMPT": "1",
        "CORRAL_CONTROL": "/run/ctl", "CORRAL_CHECKPOINT_SIGNAL": "SIGUSR1",
    }


def test_the_agents_own_interpreter_comes_first_on_the_workers_path() -> None:
    """A job's `python` is the agent's interpreter even when whoever started the agent had no venv active."""
    a = _assignment()
    env = build_rank_env(a, a.ranks[0], Path("c"), {"PATH": "/usr/bin:/venv/bin:/bin"}, interpreter_bin="/venv/bin")
    assert env["PATH"] == "/venv/bin:/usr/bin:/bin"
    assert build_rank_env(a, a.ranks[0], Path("c"), {})["PATH"].split(":")[0] == AGENT_BIN
    own = build_rank_env(_assignment(env={"PATH": "/opt/job/bin"}), a.ranks[0], Path("c"), {"PATH": "/bin"})
    assert own["PATH"] == "/opt/job/bin"  # a job that sets PATH itself keeps it


def test_resume_from_is_set_only_when_there_is_a_checkpoint() -> None:
    first = _assignment()
    assert "CORRAL_RESUME_FROM" not in build_rank_env(first, first.ranks[0], Path("c"), {})
    again = first.next_attempt(resume_from=Path("/ckpt/job-1/step-40.pt"), crash_restart=False)
    env = build_rank_env(again, again.ranks[0], Path("c"), {})
    assert env["CORRAL_RESUME_FROM"] == "/ckpt/job-1/step-40.pt"
    assert env["CORRAL_ATTEMPT"] == "2"
    assert again.restarts == 0
    assert first.next_attempt(resume_from=None, crash_restart=True).restarts == 1


def test_stale_reserved_variables_of_the_agent_do_not_leak_into_ranks() -> None:
    a = _assignment()
    env = build_rank_env(a, a.ranks[0], Path("c"), {"RANK": "99", "CORRAL_RESUME_FROM": "/old", "HOME": "/h"})
    assert env["RANK"] == "2"
    assert "CORRAL_RESUME_FROM" not in env
    assert env["HOME"] == "/h"


def test_a_job_may_not_set_variables_corral_owns() -> None:
    with pytest.raises(ValueError, match=r"env sets \['RANK'\]"):
        _assignment(env={"RANK": "0"})


@pytest.mark.parametrize(("change", "field"), [
    ({"command": ()}, "command"),
    ({"ranks": ()}, "ranks"),
    ({"world_size": 3}, "world_size"),
    ({"master_port": 0}, "master_port"),
    ({"job_id": "../x"}, "job_id"),
    ({"attempt": -1}, "attempt"),
    ({"checkpoint_signal": "SIGNOPE"}, "checkpoint.signal"),
])
def test_a_bad_assignment_names_the_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        _assignment(**change)


def test_each_global_rank_logs_to_its_own_file_under_the_job() -> None:
    a = _assignment()
    assert rank_log_path(a, a.ranks[0]) == Path("/logs/job-1/rank-2.log")
