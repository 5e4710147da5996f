"""What the node agent would refuse to start is refused by the job spec itself, from one definition.

A spec that passes `corral validate` must not fail on the node for a reason the spec already
shows: an env name the agent sets itself, a checkpoint signal a job cannot be told with, a NUL
character, a mount path a container runtime splits on. The agent's `Assignment` checks the same
sets (`corral.contracts.worker`), so the two can never disagree.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.contracts import SpecError, validate_job_spec
from corral.contracts.worker import CHECKPOINT_SIGNALS, RESERVED_ENV, signal_from_name
from corral.services.node_agent.process.assignment import Assignment, MountBind, RankAssignment

MINIMAL = {"name": "train", "queue": "research/nlp", "command": ["python", "train.py"]}


def problems_of(obj: object) -> dict[str, tuple[str, str]]:
    with pytest.raises(SpecError) as info:
        validate_job_spec(obj)
    return {p.path: (p.message, p.hint) for p in info.value.problems}


def agent_refuses(env: dict[str, str] | None = None, checkpoint_signal: str = "SIGUSR1") -> bool:
    try:
        Assignment(job_id="j1", attempt=0, world_size=1, node_rank=0, master_addr="127.0.0.1", master_port=29500,
                   ranks=(RankAssignment(0, 0, (0,)),), command=("true",), checkpoint_dir=Path("/tmp/c"),
                   log_dir=Path("/tmp/l"), env=env or {}, checkpoint_signal=checkpoint_signal)
    except ValueError:
        return True
    return False


@pytest.mark.parametrize("name", sorted(RESERVED_ENV))
def test_every_env_name_the_agent_sets_is_refused_by_the_spec_and_the_agent(name: str) -> None:
    message, hint = problems_of({**MINIMAL, "env": {name: "0"}})[f"env.{name}"]
    assert "set by Corral" in message and f"remove {name}" in hint
    assert agent_refuses(env={name: "0"})


def test_an_env_name_the_agent_does_not_set_is_the_jobs() -> None:
    assert validate_job_spec({**MINIMAL, "env": {"NCCL_DEBUG": "INFO", "CORRAL_SIM_ARGS": ""}}).env
    assert not agent_refuses(env={"NCCL_DEBUG": "INFO"})


@given(st.one_of(st.sampled_from([*CHECKPOINT_SIGNALS, "SIGKILL", "SIGSTOP", "SIGFOO", "SIGSEGV"]),
                 st.from_regex(r"^SIG[A-Z0-9]{1,8}$", fullmatch=True)))
def test_the_spec_accepts_a_checkpoint_signal_exactly_when_the_agent_does(name: str) -> None:
    try:
        validate_job_spec({**MINIMAL, "checkpoint": {"signal": name}})
        spec_ok = True
    except SpecError as exc:
        assert [p.path for p in exc.problems] == ["checkpoint.signal"]
        spec_ok = False
    assert spec_ok is not agent_refuses(checkpoint_signal=name)


@pytest.mark.parametrize("name", CHECKPOINT_SIGNALS)
def test_every_accepted_signal_can_be_sent_on_this_platform(name: str) -> None:
    assert signal_from_name(name) is getattr(signal, name)


def test_unknown_and_uncatchable_signals_name_the_field_and_the_choices() -> None:
    message, hint = problems_of({**MINIMAL, "checkpoint": {"signal": "SIGFOO"}})["checkpoint.signal"]
    assert "SIGFOO" in message and "SIGUSR1" in hint
    _, hint = problems_of({**MINIMAL, "checkpoint": {"signal": "SIGKILL"}})["checkpoint.signal"]
    assert "cannot be caught" in hint


def test_nul_characters_no_process_can_be_given_are_refused() -> None:
    found = problems_of({**MINIMAL, "command": ["python", "a\x00b"], "env": {"X": "1\x002"}})
    assert "NUL" in found["command[1]"][0] and "NUL" in found["env.X"][0]


def test_an_empty_program_is_refused_but_a_sim_job_runs_no_program() -> None:
    assert "empty" in problems_of({**MINIMAL, "command": [" ", "x"]})["command[0]"][0]
    assert validate_job_spec({**MINIMAL, "command": [""], "runtime": "sim", "duration_seconds": 1}).command == [""]


@pytest.mark.parametrize(("runtime", "path"), [("docker", "/data:x"), ("podman", "/a:b"), ("apptainer", "/a,b")])
def test_a_mount_path_the_container_runtime_would_split_is_refused(runtime: str, path: str) -> None:
    found = problems_of({"name": "t", "queue": "q", "runtime": runtime, "image": "img",
                         "mounts": [{"source": path, "target": "/data"}]})
    assert runtime in found["mounts[0].source"][0]


def test_the_sandbox_binds_any_path() -> None:
    spec = validate_job_spec({**MINIMAL, "runtime": "sandbox", "mounts": [{"source": "/a:b,c", "target": "/d:e"}]})
    assert spec.mounts[0].source == "/a:b,c"


def agent_refuses_mount(target: str) -> bool:
    try:
        Assignment(job_id="j1", attempt=0, world_size=1, node_rank=0, master_addr="127.0.0.1", master_port=29500,
                   ranks=(RankAssignment(0, 0, (0,)),), command=("true",), checkpoint_dir=Path("/tmp/c"),
                   log_dir=Path("/tmp/l"), mounts=(MountBind("/srv/data", target),), runtime="sandbox")
    except ValueError:
        return True
    return False


@pytest.mark.parametrize("runtime", ["sandbox", "docker"])
@pytest.mark.parametrize("target", ["/proc", "/dev", "/sys", "/etc", "/etc/", "//dev", "/proc/1", "/dev/shm",
                                    "/sys/fs/cgroup", "/dev/nvidia0"])
def test_a_target_that_would_hide_a_system_folder_is_refused_naming_the_field(runtime: str, target: str) -> None:
    spec: dict[str, object] = {**MINIMAL, "runtime": runtime, "mounts": [
        {"source": "/srv/ok", "target": "/data"}, {"source": "/srv/data", "target": target}]}
    if runtime == "docker":
        spec["image"] = "img"
    found = problems_of(spec)
    assert list(found) == ["mounts[1].target"]
    message, hint = found["mounts[1].target"]
    assert target in message and "system folder" in message
    assert "/mnt/" in hint and "/etc" in hint
    assert agent_refuses_mount(target)


@pytest.mark.parametrize("target", ["/data", "/mnt/data", "/home/alice/data", "/workspace/a/b", "/etc/myapp",
                                    "/tmp/x", "/devices", "/system"])
def test_any_other_target_is_accepted(target: str) -> None:
    spec = validate_job_spec({**MINIMAL, "runtime": "sandbox", "mounts": [{"source": "/srv/data", "target": target}]})
    assert spec.mounts[0].target == target
    assert not agent_refuses_mount(target)
