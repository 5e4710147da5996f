"""A node agent running as root with `--run-as submitter` runs each job as its submitter's OS user.

A rank run as the agent's own user (root on a real node) lets a submitter's command read anything
on the node, so the ranks of a job run as the OS account named by the user its
JobSubmitted records (Slurm's model); a user with no account, or root in a queue without
`allow_root`, is refused with a WorkerExited naming the user and the fix. Real nats-server, a real
agent in this process, real stepds; the ranks are `sh` (the venv's interpreter may live in root's
home, which `nobody` cannot enter). Runs only as root (only root can switch users).
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import stat
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from corral.bus import Bus
from corral.contracts.cluster import parse_cluster_shorthand
from corral.contracts.envelope import job_stream, queue_stream
from corral.contracts.events import JobSubmitted, QueueConfigured, WorkerExited, WorkerStarted
from corral.contracts.jobspec import JobSpec
from corral.contracts.queues import QueueSpec
from corral.services.node_agent.process.run_as import RefusalCode, RunAs
from corral.services.node_agent.service import AgentHost, AgentOptions, run_agents
from tests.integration.test_node_agent_service import Cluster, Seen, _subscribe, reserved, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only root can run ranks as another user")

NOBODY = pwd.getpwnam("nobody")
SECRET = "hunter2-agent-password"

#: What a rank reports about itself, into its own checkpoint directory (the one place it may write).
PROBE = ['sh', '-c', 'd="$CORRAL_CHECKPOINT_DIR"; id -u > "$d/uid"; id -G > "$d/groups"; '
         'echo "$HOME $USER $LOGNAME" > "$d/who"; env > "$d/env"; '
         'cat /etc/shadow > /dev/null 2>&1 && echo yes > "$d/shadow" || echo no > "$d/shadow"']
#: The probe, then it says it is ready and runs until the test writes `go` (its folder is looked at
#: while it runs: once a completed gang is reported, its folder is removed).
HELD_PROBE = ["sh", "-c", PROBE[2] + '; echo > "$d/ready"; while ! [ -e "$d/go" ]; do sleep 0.05; done']


@pytest.fixture
async def agent(nats_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Cluster]:
    """One fake node (2 GPUs), process runtime, ranks as their submitters, in a directory `nobody`
    can reach (pytest's tmp_path is under a 0700 directory)."""
    monkeypatch.setenv("CORRAL_NATS_URL", f"nats://agent:{SECRET}@127.0.0.1:4222")  # what ranks must not see
    monkeypatch.setenv("CORRAL_TEST_DB_PASSWORD", SECRET)
    work = Path(tempfile.mkdtemp(prefix="corral-run-as-"))
    work.chmod(0o755)
    bus = await Bus.connect(nats_url, namespace)
    await bus.ensure_streams()
    seen = Seen()
    await _subscribe(bus, seen)
    options = AgentOptions(work_dir=work / "nodes", heartbeat_seconds=0.2, stop_grace_seconds=2.0,
                           stop_workers_on_exit=True, run_as=RunAs.SUBMITTER)
    c = Cluster(bus, seen, options)
    ready = asyncio.Event()

    def on_ready(host: AgentHost) -> None:
        c.host = host
        ready.set()

    stop = asyncio.Event()
    task = asyncio.create_task(run_agents(nats_url, namespace, parse_cluster_shorthand("1x2:H100").inventories(),
                                          options, stop, on_ready=on_ready))
    await asyncio.wait_for(ready.wait(), 15)
    try:
        yield c
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await bus.close()
        shutil.rmtree(work, ignore_errors=True)


def submitted(job_id: str, user: str | None, queue: str = "team-a", **spec: Any) -> JobSubmitted:
    return JobSubmitted.new(stream=job_stream(job_id), actor=f"user/{user}", job_id=job_id, user=user,
                            spec=JobSpec(name=job_id, queue=queue, runtime="process",
                                         command=spec.pop("command", PROBE), **spec))


async def configure(c: Cluster, queue: QueueSpec) -> None:
    await c.publish(QueueConfigured.new(stream=queue_stream(queue.name), actor="admin", queue=queue))


async def run(c: Cluster, job_id: str, user: str | None, queue: str = "team-a") -> WorkerExited:
    await c.publish(submitted(job_id, user, queue))
    await c.publish(reserved(job_id, [(0, "node-0", [0])]))
    await wait_for(lambda: len(c.seen.of(WorkerExited, job_id)) == 1)
    return c.seen.of(WorkerExited, job_id)[0]


async def test_a_job_runs_as_its_submitters_os_account_without_the_agents_secrets(agent: Cluster) -> None:
    await agent.publish(submitted("job-nobody", "nobody", command=HELD_PROBE))
    await agent.publish(reserved("job-nobody", [(0, "node-0", [0])]))
    out = agent.options.checkpoints / "job-nobody"
    await wait_for(lambda: (out / "ready").exists())
    # the stepd's files (the job's env among them) stay the agent's; the rank only passes through
    folder = agent.options.work_dir / "node-0" / "run" / "job-nobody.attempt-0"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o711  # while the gang runs: through to its control file
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.glob("*.json")}
    assert {"launch.json", "state.json"} <= modes.keys()  # with the log shipper's cursor, rank-0.json
    assert set(modes.values()) == {0o600}, modes
    assert (folder / "rank-0.control").stat().st_uid == NOBODY.pw_uid
    (out / "go").touch()
    await wait_for(lambda: len(agent.seen.of(WorkerExited, "job-nobody")) == 1)
    exited = agent.seen.of(WorkerExited, "job-nobody")[0]
    assert exited.exit_code == 0, exited.reason
    assert (out / "uid").read_text().split() == [str(NOBODY.pw_uid)]
    assert (out / "groups").read_text().split()[0] == str(NOBODY.pw_gid)
    assert (out / "who").read_text().split() == [NOBODY.pw_dir, "nobody", "nobody"]
    assert (out / "shadow").read_text().strip() == "no"
    env = (out / "env").read_text()
    assert SECRET not in env and "CORRAL_NATS_URL" not in env
    assert "CORRAL_JOB_ID=job-nobody" in env
    # its checkpoint directory and its log are its own; the log's directory is not (the stepd, root, writes there)
    st = os.lstat(out)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY.pw_uid, 0o700)
    log = agent.options.logs / "job-nobody" / "rank-0.log"
    assert log.stat().st_uid == NOBODY.pw_uid and log.parent.stat().st_uid == 0
    assert "as nobody (uid" in log.read_text()
    assert len(agent.seen.of(WorkerStarted, "job-nobody")) == 1
    await wait_for(lambda: not folder.exists())  # completed and reported: its run folder is removed


async def test_a_user_without_an_os_account_is_refused_naming_the_user_and_the_fix(agent: Cluster) -> None:
    exited = await run(agent, "job-ghost", "corral-no-such-user")
    assert exited.exit_code is None
    assert exited.reason.code == RefusalCode.NO_OS_ACCOUNT
    assert "`corral-no-such-user` has no OS account on node-0" in exited.reason.message
    assert "useradd corral-no-such-user" in exited.reason.message and "--run-as agent" in exited.reason.message
    assert agent.seen.of(WorkerStarted, "job-ghost") == []
    assert not (agent.options.checkpoints / "job-ghost").exists()
    # a job that names no user at all is refused too
    anonymous = await run(agent, "job-anon", None)
    assert anonymous.reason.code == RefusalCode.NO_SUBMITTER and anonymous.exit_code is None


async def test_root_is_refused_unless_the_queue_allows_it(agent: Cluster) -> None:
    await configure(agent, QueueSpec(name="team-a"))
    await configure(agent, QueueSpec(name="trusted", allow_root=True))
    refused = await run(agent, "job-root", "root", queue="team-a")
    assert refused.exit_code is None and refused.reason.code == RefusalCode.ROOT_NOT_ALLOWED
    assert "`root` is uid 0" in refused.reason.message and "allow_root: true" in refused.reason.message
    assert "queue `team-a`" in refused.reason.message
    allowed = await run(agent, "job-root-ok", "root", queue="trusted")
    assert allowed.exit_code == 0, allowed.reason
    assert (agent.options.checkpoints / "job-root-ok" / "uid").read_text().split() == ["0"]


async def test_a_directory_the_user_cannot_reach_fails_the_start_naming_it(tmp_path: Path) -> None:
    """pytest's tmp_path lies under a 0700 directory: `nobody` could not write its checkpoints."""
    from corral.services.node_agent.process.run_as import WorkerUser
    from corral.services.node_agent.process.supervisor import ExitReason, Supervisor
    from tests.integration.test_node_agent_supervisor import Recorder, assignment

    events = Recorder()
    user = WorkerUser(name="nobody", uid=NOBODY.pw_uid, gid=NOBODY.pw_gid, groups=(NOBODY.pw_gid,), home="/",
                      shell="")
    sup = Supervisor(events, tmp_path / "run")
    start = await sup.start(assignment(tmp_path, tuple(PROBE), ranks=1, job_id="job-far", user=user))
    blocked = next(p for p in reversed([tmp_path, *tmp_path.parents]) if not p.stat().st_mode & stat.S_IXOTH)
    assert start.failed and f"{blocked} is not searchable" in start.failed[0]
    assert "user `nobody`" in start.failed[0] and f"chmod o+x {blocked}" in start.failed[0]
    (failed,) = events.of("start_failed")
    assert failed["reason"] is ExitReason.START_FAILED and failed["exit_code"] is None


async def test_a_checkpoint_dir_named_by_the_spec_is_made_as_the_submitter_and_never_given_to_them(
        agent: Cluster) -> None:
    """The review: `checkpoint: {dir: /etc}` was chowned to the submitter (own_dir ran as root on a
    folder the spec named). An existing folder is left as it is; a missing one is made with the
    submitter's rights, or the start fails naming the field."""
    victim = agent.options.work_dir.parent / "victim"
    victim.mkdir(mode=0o755)
    await agent.publish(submitted("job-steal", "nobody", checkpoint={"dir": str(victim)}))
    await agent.publish(reserved("job-steal", [(0, "node-0", [0])]))
    await wait_for(lambda: len(agent.seen.of(WorkerExited, "job-steal")) == 1)
    st = os.lstat(victim)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)  # still root's, mode unchanged
    assert agent.seen.of(WorkerExited, "job-steal")[0].exit_code != 0  # the probe cannot write there

    denied = victim / "sub"  # nobody may not create it inside root's 0755 folder
    await agent.publish(submitted("job-deny", "nobody", checkpoint={"dir": str(denied)}))
    await agent.publish(reserved("job-deny", [(0, "node-0", [0])]))
    await wait_for(lambda: len(agent.seen.of(WorkerExited, "job-deny")) == 1)
    exited = agent.seen.of(WorkerExited, "job-deny")[0]
    assert exited.exit_code != 0 and not denied.exists()
    assert agent.seen.of(WorkerStarted, "job-deny") == []

    shared = agent.options.work_dir.parent / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o1777)
    mine = shared / "runs" / "mine"
    ok = await run_with(agent, "job-mine", checkpoint={"dir": str(mine)})
    assert ok.exit_code == 0, ok.reason
    assert os.lstat(mine).st_uid == NOBODY.pw_uid and (mine / "uid").read_text().split() == [str(NOBODY.pw_uid)]


async def run_with(c: Cluster, job_id: str, **spec: Any) -> WorkerExited:
    await c.publish(submitted(job_id, "nobody", **spec))
    await c.publish(reserved(job_id, [(0, "node-0", [0])]))
    await wait_for(lambda: len(c.seen.of(WorkerExited, job_id)) == 1)
    return c.seen.of(WorkerExited, job_id)[0]
