"""Stepds forked by the warm fork server (`zygote`) keep every promise of a fresh one (the host's
gangs, `stepd_host`, in test_node_agent_stepd_host).

Real processes, no NATS: the supervisor reports through the `Recorder` of the supervisor tests.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral import environment
from corral.services.node_agent.process.fork_server import ForkServer
from corral.services.node_agent.process.supervisor import GangEnd, Supervisor
from tests.integration.test_node_agent_supervisor import UNTIL_STOPPED, Recorder, assignment, script, wait_for
from tests.processes import alive


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


async def test_a_forked_stepd_outlives_its_killed_fork_server_and_the_next_start_forks_again(tmp_path: Path) -> None:
    sup = Supervisor(Recorder(), tmp_path / "run", stepd_host=False)
    first = await sup.start(assignment(tmp_path, UNTIL_STOPPED, ranks=1, job_id="job-1"))
    stepd = sup.stepd_pid("job-1")
    assert stepd is not None and first.ok
    server = _parent(stepd)
    assert server != os.getpid()  # forked by the server, not started by the agent
    assert Path(f"/proc/{stepd}/comm").read_text().strip() == "corral-stepd"
    os.kill(server, signal.SIGKILL)
    await wait_for(lambda: not alive(server))
    assert alive(stepd) and all(alive(pid) for pid in first.pids.values())
    second = await sup.start(assignment(tmp_path, UNTIL_STOPPED, ranks=1, job_id="job-2"))
    other = sup.stepd_pid("job-2")
    assert second.ok and other is not None and _parent(other) not in (server, os.getpid())
    for job in ("job-1", "job-2"):
        outcome = await sup.stop(job, grace_seconds=2)
        assert outcome is not None and outcome.end is GangEnd.STOPPED and outcome.exits == {0: -15}
    await sup.close()


async def test_a_stepd_terminated_as_soon_as_it_is_forked_stops_its_gang(tmp_path: Path) -> None:
    """The agent knows the pid when the fork returns, before the stepd set its own SIGTERM handler."""
    sup = Supervisor(Recorder(), tmp_path / "run", stepd_host=False)
    await sup.start(assignment(tmp_path, UNTIL_STOPPED, ranks=1), wait=False)
    stepd = await sup.launched("job-1")
    assert stepd is not None
    os.kill(stepd, signal.SIGTERM)
    outcome = await asyncio.wait_for(sup.wait("job-1"), 60)  # a lost SIGTERM: the rank runs forever
    assert outcome is not None and outcome.end is GangEnd.STOPPED
    await sup.close()


class Gated(ForkServer):
    """A fork server whose requests wait for `gate`: what the agent does before the stepd starts."""

    def __init__(self) -> None:
        super().__init__(sys.executable, environment.mapping())
        self.gate = asyncio.Event()

    async def spawn(self, folder: Path, runtime: str = "process") -> tuple[int, str | None, Any, bool]:
        await self.gate.wait()
        return await super().spawn(folder, runtime)


@pytest.mark.parametrize("hosted", [True, False])
async def test_a_start_returns_before_its_stepd_is_asked_for_and_a_stop_sent_meanwhile_stops_it(
        tmp_path: Path, hosted: bool) -> None:
    launcher = Gated()
    launcher._host = hosted
    sup = Supervisor(Recorder(), tmp_path / "run", launcher=launcher)
    try:
        await asyncio.wait_for(sup.start(assignment(tmp_path, UNTIL_STOPPED, ranks=1), wait=False), 5)
        assert sup.running_jobs() == ["job-1"] and sup.stepd_pid("job-1") is None
        assert sup.send_stop("job-1", grace_seconds=2)
        launcher.gate.set()
        assert await asyncio.wait_for(sup.launched("job-1"), 30) is not None
        outcome = await asyncio.wait_for(sup.wait("job-1"), 60)
        assert outcome is not None and outcome.end is GangEnd.STOPPED
    finally:
        await sup.close()
        await launcher.close()


INHERITED_IGNORES = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGUSR1)


@pytest.fixture(params=["agent ignores none", "agent ignores some", "forked, agent ignores some"])
def agent_ignores(request: pytest.FixtureRequest) -> Iterator[bool]:
    """An agent started with `&` by a shell, or under nohup, has SIGINT, SIGQUIT or SIGHUP ignored;
    the fork server and every stepd it forks inherit that."""
    saved = {sig: signal.getsignal(sig) for sig in INHERITED_IGNORES}
    if request.param.endswith("agent ignores some"):
        for sig in INHERITED_IGNORES:
            signal.signal(sig, signal.SIG_IGN)
    yield request.param.startswith("forked")
    for sig, handler in saved.items():
        signal.signal(sig, handler)


async def test_a_stepds_ranks_ignore_no_signal(tmp_path: Path, agent_ignores: bool) -> None:
    """Ignored signals survive exec: a fork server or stepd that ignored one would hand it to every
    rank, as slurmstepd's tasks start with every signal at its default."""
    dump = script(tmp_path, "sigs.py", """
        import os
        status = open("/proc/self/status").read()
        out = os.path.join(os.environ["CORRAL_CHECKPOINT_DIR"], "status")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        open(out, "w").write(status)
    """)
    sup = Supervisor(Recorder(), tmp_path / "run", stepd_host=not agent_ignores)
    await sup.start(assignment(tmp_path, dump, ranks=1))
    outcome = await asyncio.wait_for(sup.wait("job-1"), 60)
    assert outcome is not None and outcome.end is GangEnd.COMPLETED
    status = dict(line.split(":\t", 1) for line in (tmp_path / "ckpt" / "status").read_text().splitlines()
                  if ":\t" in line)
    ignored = int(status["SigIgn"], 16)
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
        assert not ignored & (1 << (sig - 1)), f"{sig.name} ignored in the rank"
    await sup.close()
