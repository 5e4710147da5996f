"""Gangs hosted by the fork server (`stepd_host`): one stepd for many gangs, with a stepd's promises.

Real processes, no NATS: the supervisor reports through the `Recorder` of the supervisor tests.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from corral.services.node_agent.process.assignment import sim_command
from corral.services.node_agent.process.step_files import STATE, STEPD_LOG, attempt_dir, read_state
from corral.services.node_agent.process.supervisor import ExitReason, GangEnd, Supervisor
from corral.worker import CHECKPOINTED_EXIT_CODE
from tests.integration.test_node_agent_supervisor import UNTIL_STOPPED, Recorder, assignment, script, wait_for
from tests.processes import alive


async def _two_gangs(tmp_path: Path, sup: Supervisor) -> tuple[int, dict[str, dict[int, int]]]:
    pids = {}
    for job in ("job-1", "job-2"):
        started = await sup.start(assignment(tmp_path, UNTIL_STOPPED, ranks=2, job_id=job))
        assert started.ok
        pids[job] = dict(started.pids)
    host = sup.stepd_pid("job-1")
    assert host is not None and host == sup.stepd_pid("job-2") and host != os.getpid()
    return host, pids


async def test_hosted_gangs_share_one_stepd_that_outlives_the_agent_and_is_adopted(tmp_path: Path) -> None:
    first = Supervisor(Recorder(), tmp_path / "run")
    host, pids = await _two_gangs(tmp_path, first)
    state = read_state(attempt_dir(tmp_path / "run", "job-1", 0))
    assert state is not None and state["stepd_pid"] == host and state["stepd_shared"] is True
    await first.detach()  # the agent goes: the host takes no new gang, and runs the ones it holds
    assert alive(host) and all(alive(p) for job in pids.values() for p in job.values())
    events = Recorder()
    second = Supervisor(events, tmp_path / "run")
    adopted = await second.adopt()
    assert sorted(g.job_id for g in adopted if g.running) == ["job-1", "job-2"]
    outcome = await second.stop("job-1", grace_seconds=2)
    assert outcome is not None and outcome.end is GangEnd.STOPPED and outcome.exits == {0: -15, 1: -15}
    assert alive(host) and all(alive(p) for p in pids["job-2"].values())  # the other gang runs on
    outcome = await second.stop("job-2", grace_seconds=2)
    assert outcome is not None and outcome.end is GangEnd.STOPPED
    await wait_for(lambda: not alive(host))  # its last gang ended: so does it
    await second.close()
    assert not (attempt_dir(tmp_path / "run", "job-1", 0) / STEPD_LOG).exists()  # nothing to say


async def test_a_killed_host_takes_every_hosted_gang_down_and_each_is_reported(tmp_path: Path) -> None:
    """Its failure domain: every gang it held. Their ranks are killed and reported as crashed."""
    events = Recorder()
    sup = Supervisor(events, tmp_path / "run")
    host, pids = await _two_gangs(tmp_path, sup)
    os.kill(host, signal.SIGKILL)
    for job in ("job-1", "job-2"):
        outcome = await asyncio.wait_for(sup.wait(job), 15)
        assert outcome is not None and outcome.end is GangEnd.FAILED
    exits = events.of("exited")
    assert len(exits) == 4 and {e["reason"] for e in exits} == {ExitReason.CRASHED}
    await wait_for(lambda: not any(alive(p) for job in pids.values() for p in job.values()))
    started = await sup.start(assignment(tmp_path, UNTIL_STOPPED, ranks=1, job_id="job-3"))  # a new host
    assert started.ok and sup.stepd_pid("job-3") not in (host, None)
    await sup.close()


async def test_sigterm_to_the_host_stops_every_gang_it_holds(tmp_path: Path) -> None:
    sup = Supervisor(Recorder(), tmp_path / "run")
    host, _ = await _two_gangs(tmp_path, sup)
    os.kill(host, signal.SIGTERM)
    for job in ("job-1", "job-2"):
        outcome = await asyncio.wait_for(sup.wait(job), 15)
        assert outcome is not None and outcome.end is GangEnd.STOPPED
    await wait_for(lambda: not alive(host))
    started = await sup.start(assignment(tmp_path, UNTIL_STOPPED, ranks=1, job_id="job-3"))  # a new host
    assert started.ok and sup.stepd_pid("job-3") not in (host, None)
    await sup.stop("job-3", grace_seconds=2)
    await sup.close()


async def test_a_hosted_gang_checkpoints_on_preemption_while_another_crashes(tmp_path: Path) -> None:
    """Each hosted gang is its own: one preempted (checkpoint, exit 85), one torn down by a crash."""
    ckpt = sim_command(60, python=sys.executable, step_seconds=0.02)
    crash = script(tmp_path, "crash.py", """
        import os, signal, sys, time
        if os.environ["RANK"] == "1":
            time.sleep(0.5)
            sys.exit(3)
        signal.pause()
    """)
    events = Recorder()
    sup = Supervisor(events, tmp_path / "run")
    assert (await sup.start(assignment(tmp_path, ckpt, ranks=1, job_id="ckpt"))).ok
    log0 = tmp_path / "logs" / "ckpt" / "rank-0.log"
    assert (await sup.start(assignment(tmp_path, crash, ranks=2, job_id="crash"))).ok
    assert sup.stepd_pid("ckpt") == sup.stepd_pid("crash")
    crashed = await asyncio.wait_for(sup.wait("crash"), 15)
    assert crashed is not None and crashed.end is GangEnd.FAILED and crashed.failed_rank == 1
    assert crashed.exits == {0: -15, 1: 3}
    await wait_for(lambda: log0.exists() and "step=10\n" in log0.read_text())
    preempted = await asyncio.wait_for(sup.preempt("ckpt", grace_seconds=10), 15)
    assert preempted is not None and preempted.end is GangEnd.PREEMPTED
    assert preempted.exits == {0: CHECKPOINTED_EXIT_CODE}
    assert preempted.checkpoint is not None and preempted.checkpoint.step >= 10
    assert (attempt_dir(tmp_path / "run", "ckpt", 0) / STATE).stat().st_size > 0
    await sup.close()
