"""Whose OS account a job's ranks run as (`run_as`): the decision, the environment, the paths, the flag."""

from __future__ import annotations

import argparse
import os
import pwd
import tempfile
from pathlib import Path

import pytest

from corral.contracts import SpecError, load_queues_text
from corral.services.node_agent.__main__ import options, parser
from corral.services.node_agent.process.assignment import Assignment, RankAssignment
from corral.services.node_agent.process.run_as import (
    RefusalCode,
    Refused,
    RunAs,
    WorkerUser,
    reach_problem,
    resolve,
    switches_users,
    unsearchable,
    user_base_env,
)
from corral.services.node_agent.process.step_files import assignment_from_json, assignment_to_json

ACCOUNTS = {
    "alice": pwd.struct_passwd(("alice", "x", 1001, 1001, "", "/home/alice", "/bin/bash")),
    "root": pwd.struct_passwd(("root", "x", 0, 0, "", "/root", "/bin/sh")),
    "toor": pwd.struct_passwd(("toor", "x", 0, 0, "", "/root", "/bin/sh")),
}


def lookup(name: str) -> pwd.struct_passwd:
    return ACCOUNTS[name]


def groups(name: str, gid: int) -> list[int]:
    return [27, gid, 44] if name == "alice" else [gid]


def decide(user: str | None, allow_root: bool = False) -> WorkerUser | Refused:
    return resolve(user, queue="team-a", allow_root=allow_root, node="gpu-7", lookup=lookup, grouplist=groups)


def test_a_known_user_runs_with_its_uid_gid_and_groups_primary_first() -> None:
    found = decide("alice")
    assert found == WorkerUser(name="alice", uid=1001, gid=1001, groups=(1001, 27, 44), home="/home/alice",
                               shell="/bin/bash")
    assert found.env() == {"HOME": "/home/alice", "USER": "alice", "LOGNAME": "alice", "SHELL": "/bin/bash"}


@pytest.mark.parametrize(("user", "code", "words"), [
    (None, RefusalCode.NO_SUBMITTER, ["names no submitting user", "--run-as agent"]),
    ("mallory", RefusalCode.NO_OS_ACCOUNT, ["`mallory` has no OS account on gpu-7", "useradd mallory",
                                            "--run-as agent"]),
    ("bad\x00name", RefusalCode.NO_OS_ACCOUNT, ["no OS account"]),
    ("root", RefusalCode.ROOT_NOT_ALLOWED, ["`root` is uid 0", "queue `team-a`", "allow_root: true"]),
    ("toor", RefusalCode.ROOT_NOT_ALLOWED, ["`toor` is uid 0"]),  # any name of uid 0, not just "root"
])
def test_refusals_name_the_user_and_the_fix(user: str | None, code: RefusalCode, words: list[str]) -> None:
    found = decide(user)
    assert isinstance(found, Refused) and found.code is code
    for word in words:
        assert word in found.message


def test_root_runs_where_the_queue_allows_it() -> None:
    found = decide("root", allow_root=True)
    assert isinstance(found, WorkerUser) and found.uid == 0


def test_only_a_root_agent_asked_to_switches_users() -> None:
    assert switches_users(RunAs.SUBMITTER, euid=0)
    assert not switches_users(RunAs.SUBMITTER, euid=1000)  # a laptop: jobs run as the agent's user
    assert not switches_users(RunAs.AGENT, euid=0)


def test_a_rank_run_as_its_user_inherits_none_of_the_agents_secrets() -> None:
    user = WorkerUser(name="alice", uid=1001, gid=1001, groups=(1001,), home="/home/alice", shell="")
    base = {"PATH": "/usr/bin", "HOME": "/root", "USER": "root", "CORRAL_NATS_URL": "nats://a:pw@h:4222",
            "CORRAL_POSTGRES_DSN": "postgresql://p:pw@h/c", "CORRAL_NATS_CREDENTIALS": "/etc/corral/agent.json",
            "CORRAL_NATS_AGENTS_PASSWORD": "pw", "PGPASSWORD": "pw", "SOME_API_TOKEN": "t", "XDG_RUNTIME_DIR": "/run/0",
            "LANG": "C.UTF-8"}
    assert user_base_env(base, user) == {"PATH": "/usr/bin", "HOME": "/home/alice", "USER": "alice",
                                         "LOGNAME": "alice", "LANG": "C.UTF-8"}


def test_a_directory_the_user_cannot_search_is_named() -> None:
    with tempfile.TemporaryDirectory() as base:  # pytest's tmp_path is itself under a 0700 directory
        _check_searchable(Path(base))


def _check_searchable(tmp_path: Path) -> None:
    nobody = WorkerUser(name="nobody", uid=65534, gid=65534, groups=(65534,), home="/", shell="")
    private = tmp_path / "private"
    (private / "job").mkdir(parents=True)
    tmp_path.chmod(0o755)
    private.chmod(0o700)
    assert unsearchable(private / "job" / "ckpt", nobody) == private
    problem = reach_problem([tmp_path / "x", private / "job" / "ckpt"], nobody)
    assert problem is not None and f"{private} is not searchable" in problem and "chmod o+x" in problem
    private.chmod(0o711)
    assert unsearchable(private / "job" / "ckpt", nobody) is None
    private.chmod(0o710)  # its group may search
    member = WorkerUser(name="m", uid=65534, gid=65534, groups=(65534, os.stat(private).st_gid), home="/", shell="")
    assert unsearchable(private / "job" / "ckpt", nobody) == private
    assert unsearchable(private / "job" / "ckpt", member) is None


def test_the_user_travels_in_launch_json(tmp_path: Path) -> None:
    user = WorkerUser(name="alice", uid=1001, gid=1001, groups=(1001, 27), home="/home/alice", shell="/bin/sh")
    a = Assignment(job_id="j", attempt=1, world_size=1, node_rank=0, master_addr="h", master_port=29500,
                   ranks=(RankAssignment(0, 0, (0,)),), command=("true",), checkpoint_dir=tmp_path / "c",
                   log_dir=tmp_path / "l", user=user)
    assert assignment_from_json(assignment_to_json(a)) == a
    assert assignment_from_json(assignment_to_json(Assignment(**{**a.__dict__, "user": None}))).user is None


def _args(*argv: str) -> argparse.Namespace:
    return parser().parse_args(["--inventory", "x", *argv])


def test_the_agent_cli_runs_jobs_as_their_submitters_unless_told_otherwise(tmp_path: Path) -> None:
    assert options(_args("--state-dir", str(tmp_path)), {}).run_as is RunAs.SUBMITTER
    assert options(_args("--state-dir", str(tmp_path)), {"CORRAL_AGENT_RUN_AS": "agent"}).run_as is RunAs.AGENT
    assert options(_args("--state-dir", str(tmp_path), "--run-as", "submitter"),
                   {"CORRAL_AGENT_RUN_AS": "agent"}).run_as is RunAs.SUBMITTER
    with pytest.raises(Exception, match=r"CORRAL_AGENT_RUN_AS='nobody': give one of submitter, agent"):
        options(_args("--state-dir", str(tmp_path)), {"CORRAL_AGENT_RUN_AS": "nobody"})


def test_allow_root_is_a_checked_queue_field() -> None:
    (q,) = load_queues_text("queues:\n- {name: ops, allow_root: true}\n").queues
    assert q.allow_root is True
    assert load_queues_text("queues:\n- {name: ops}\n").queues[0].allow_root is False
    with pytest.raises(SpecError) as err:
        load_queues_text("queues:\n- {name: ops, allow_root: sometimes}\n")
    problem = err.value.problems[0]
    assert problem.path == "queues[0].allow_root" and "uid 0" in problem.hint


def test_a_workdir_the_user_cannot_enter_is_named() -> None:
    nobody = WorkerUser(name="nobody", uid=65534, gid=65534, groups=(65534,), home="/", shell="")
    with tempfile.TemporaryDirectory() as base:
        Path(base).chmod(0o755)
        work = Path(base) / "work"
        work.mkdir(mode=0o700)
        problem = reach_problem([Path(base) / "ckpt"], nobody, work)
        assert problem is not None and f"cannot enter the job's workdir {work}" in problem
        work.chmod(0o755)
        assert reach_problem([Path(base) / "ckpt"], nobody, work) is None
