"""The supervisor with real processes: env, logs, checkpoint/resume, escalation, crash handling.

No NATS here: the supervisor reports through `AgentEvents`, recorded in memory. Every gang runs
under its own stepd process (see `stepd`), so these also test the stepd.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.services.node_agent.process.assignment import AGENT_BIN, Assignment, RankAssignment, sim_command
from corral.services.node_agent.process.step_files import is_reported, read_state
from corral.services.node_agent.process.supervisor import ExitReason, GangEnd, GangOutcome, Supervisor
from corral.worker import CHECKPOINTED_EXIT_CODE
from tests.processes import alive, exited

PY = sys.executable
# a worker that runs until a signal stops it (no clock: it never ends by itself)
UNTIL_STOPPED = (PY, "-c", "import signal; signal.pause()")


@dataclass
class Recorder:
    """AgentEvents that remembers every call, and lets a test wait for one."""

    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def _add(self, kind: str, **payload: Any) -> None:
        self.calls.append((kind, payload))
        self.changed.set()

    async def worker_started(self, job_id: str, rank: int, pid: int, attempt: int, *, at: float,
                             cause: str | None) -> None:
        self._add("started", job_id=job_id, rank=rank, pid=pid, attempt=attempt)

    async def worker_exited(self, job_id: str, rank: int, exit_code: int | None, attempt: int,
                            reason: ExitReason, *, at: float, cause: str | None, message: str = "") -> None:
        kind = "start_failed" if reason is ExitReason.START_FAILED else "exited"
        self._add(kind, job_id=job_id, rank=rank, exit_code=exit_code, attempt=attempt, reason=reason,
                  message=message)

    async def checkpoint_done(self, job_id: str, path: Path, step: int, rank: int, attempt: int, *, at: float,
                              cause: str | None) -> None:
        self._add("checkpoint", job_id=job_id, path=path, step=step, rank=rank, attempt=attempt)

    async def gang_ended(self, outcome: GangOutcome) -> None:
        self._add("ended", outcome=outcome)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [payload for k, payload in self.calls if k == kind]


async def wait_for(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    async def loop() -> None:
        while not condition():
            await asyncio.sleep(0.02)
    await asyncio.wait_for(loop(), timeout)


def assignment(tmp_path: Path, command: tuple[str, ...], *, ranks: int = 2, **extra: Any) -> Assignment:
    return Assignment(job_id=extra.pop("job_id", "job-1"), attempt=extra.pop("attempt", 0),
                      world_size=ranks, node_rank=0, master_addr="127.0.0.1", master_port=29555,
                      ranks=tuple(RankAssignment(r, r, (r,)) for r in range(ranks)), command=command,
                      checkpoint_dir=tmp_path / "ckpt", log_dir=tmp_path / "logs", **extra)


def script(tmp_path: Path, name: str, body: str) -> tuple[str, ...]:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return (PY, str(path))


async def test_launched_rank_sees_exactly_the_specified_environment(tmp_path: Path) -> None:
    dump = script(tmp_path, "dump.py", """
        import json, os
        out = os.path.join(os.environ["CORRAL_CHECKPOINT_DIR"], "env-" + os.environ["RANK"] + ".json")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        env = dict(os.environ)
        env.pop("LC_CTYPE", None)  # the interpreter may coerce the C locale itself (PEP 538)
        json.dump(env, open(out, "w"))
    """)
    events = Recorder()
    sup = Supervisor(events, tmp_path / "run", base_env={"PATH": "/usr/bin:/bin", "RANK": "stale"})
    a = Assignment(job_id="env-job", attempt=3, world_size=4, node_rank=1, group_world_size=2,
                   master_addr="127.0.0.1", master_port=29501,
                   ranks=(RankAssignment(2, 0, (4, 5)), RankAssignment(3, 1, (6, 7))),
                   command=dump, checkpoint_dir=tmp_path / "ckpt", log_dir=tmp_path / "logs",
                   env={"LR": "0.5"}, resume_from=tmp_path / "ckpt" / "old.pt")
    await sup.start(a)
    outcome = await sup.wait("env-job")
    assert outcome is not None and outcome.end is GangEnd.COMPLETED
    env = json.loads((tmp_path / "ckpt" / "env-3.json").read_text())
    assert env == {
        # inherited, with the agent's own interpreter's folder first (a job's `python` is the agent's);
        # PYTHONUNBUFFERED by default; the stale RANK dropped
        "PATH": f"{AGENT_BIN}:/usr/bin:/bin", "PYTHONUNBUFFERED": "1",
        "CUDA_VISIBLE_DEVICES": "6,7", "NVIDIA_VISIBLE_DEVICES": "6,7",
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29501",
        "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "ROLE_NAME": "default", "ROLE_RANK": "3",
        "ROLE_WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "env-job", "TORCHELASTIC_RESTART_COUNT": "3",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "LR": "0.5", "CORRAL_JOB_ID": "env-job", "CORRAL_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "CORRAL_RESUME_FROM": str(tmp_path / "ckpt" / "old.pt"), "CORRAL_ATTEMPT": "3",
        "CORRAL_CONTROL": str(tmp_path / "run" / "env-job.attempt-3" / "rank-3.control"),
        "CORRAL_CHECKPOINT_SIGNAL": "SIGUSR1",
    }
    assert json.loads((tmp_path / "ckpt" / "env-2.json").read_text())["CUDA_VISIBLE_DEVICES"] == "4,5"
    assert [(c["rank"], c["attempt"]) for c in events.of("started")] == [(2, 3), (3, 3)]


async def test_each_rank_output_goes_to_its_log_appended_across_attempts(tmp_path: Path) -> None:
    hello = script(tmp_path, "hello.py", """
        import os, sys
        print("out from rank", os.environ["RANK"], "attempt", os.environ["CORRAL_ATTEMPT"])
        print("err from rank", os.environ["RANK"], file=sys.stderr)
    """)
    sup = Supervisor(Recorder(), tmp_path / "run")
    first = assignment(tmp_path, hello)
    await sup.start(first)
    await sup.wait("job-1")
    await sup.start(first.next_attempt(resume_from=None, crash_restart=False))
    await sup.wait("job-1")
    text = (tmp_path / "logs" / "job-1" / "rank-1.log").read_text()
    assert "out from rank 1 attempt 0" in text and "out from rank 1 attempt 1" in text
    assert "err from rank 1" in text
    assert text.index("attempt 0 rank 1") < text.index("attempt 1 rank 1")
    assert "out from rank 0" not in text


async def test_sim_worker_checkpoints_on_preemption_and_resumes_from_that_step(tmp_path: Path) -> None:
    events = Recorder()
    sup = Supervisor(events, tmp_path / "run")
    first = assignment(tmp_path, sim_command(60, python=PY, step_seconds=0.02))
    await sup.start(first)
    log0 = tmp_path / "logs" / "job-1" / "rank-0.log"
    await wait_for(lambda: log0.exists() and "step=10\n" in log0.read_text())

    outcome = await sup.preempt("job-1", grace_seconds=10)
    assert outcome is not None
    assert outcome.end is GangEnd.PREEMPTED
    assert outcome.exits == {0: CHECKPOINTED_EXIT_CODE, 1: CHECKPOINTED_EXIT_CODE}
    assert outcome.checkpoint is not None and outcome.checkpoint.rank == 0
    step = outcome.checkpoint.step
    assert step >= 10
    assert json.loads(outcome.checkpoint.path.read_text()) == {"step": step}
    assert [(c["rank"], c["step"]) for c in events.of("checkpoint")] == [(0, step)]
    assert {c["reason"] for c in events.of("exited")} == {ExitReason.CHECKPOINTED}

    resumed = first.next_attempt(resume_from=outcome.resume_from, crash_restart=False)
    await sup.start(resumed)
    await wait_for(lambda: "attempt=1 start" in log0.read_text())
    assert f"sim rank=0 attempt=1 start step={step} " in log0.read_text()
    await sup.stop("job-1", grace_seconds=2)


async def test_worker_ignoring_signals_is_sigtermed_then_sigkilled_at_the_deadline(tmp_path: Path) -> None:
    stubborn = script(tmp_path, "stubborn.py", """
        import signal, time, sys
        for s in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(s, lambda *a: print("ignoring", a[0], flush=True))
        print("ready", flush=True)
        while True:
            time.sleep(0.01)
    """)
    events = Recorder()
    sup = Supervisor(events, tmp_path / "run")
    await sup.start(assignment(tmp_path, stubborn, ranks=1))
    log0 = tmp_path / "logs" / "job-1" / "rank-0.log"
    await wait_for(lambda: "ready" in log0.read_text())
    loop = asyncio.get_running_loop()
    began = loop.time()
    outcome = await sup.preempt("job-1", grace_seconds=0.5)
    took = loop.time() - began
    assert outcome is not None and outcome.end is GangEnd.PREEMPTED
    assert outcome.exits == {0: -9}
    assert outcome.checkpoint is None
    assert 0.45 <= took < 3.0
    text = log0.read_text()
    assert "ignoring 10" in text and "ignoring 15" in text  # SIGUSR1 then SIGTERM, then SIGKILL
    assert events.of("exited")[0]["reason"] is ExitReason.PREEMPTED


async def test_a_crashed_rank_takes_the_local_gang_down_and_restarts_from_the_last_checkpoint(
        tmp_path: Path) -> None:
    events = Recorder()
    sup = Supervisor(events, tmp_path / "run", kill_grace=2.0)
    crashing = sim_command(60, python=PY, step_seconds=0.02, extra=(
        "--fail-at-step", "20", "--fail-rank", "1", "--fail-code", "7", "--checkpoint-every", "3"))
    first = assignment(tmp_path, crashing, ranks=3, max_restarts=1)
    await sup.start(first)
    outcome = await asyncio.wait_for(sup.wait("job-1"), 15)
    assert outcome is not None and outcome.end is GangEnd.FAILED
    assert (outcome.failed_rank, outcome.failed_exit_code) == (1, 7)
    reasons = {c["rank"]: c["reason"] for c in events.of("exited")}
    assert reasons == {1: ExitReason.CRASHED, 0: ExitReason.GANG_KILLED, 2: ExitReason.GANG_KILLED}
    assert sup.running_jobs() == []
    last_reported = events.of("checkpoint")[-1]  # rank 0 checkpointed every 3 steps before rank 1 crashed
    assert last_reported["step"] % 3 == 0
    assert outcome.resume_from == last_reported["path"]

    # The restart resumes from that checkpoint (attempt 1 does not crash: --fail-on-attempt is 0) ...
    again = first.next_attempt(resume_from=outcome.resume_from, crash_restart=True)
    await sup.start(again)
    log0 = tmp_path / "logs" / "job-1" / "rank-0.log"
    await wait_for(lambda: "attempt=1 start" in log0.read_text())
    assert f"attempt=1 start step={last_reported['step']} " in log0.read_text()
    await sup.stop("job-1", grace_seconds=2)
    # ... and a crash with no restart left fails the job.
    last = again.next_attempt(resume_from=None, crash_restart=True)
    failing = Assignment(**{**last.__dict__, "command": sim_command(
        60, python=PY, step_seconds=0.02, extra=("--fail-at-step", "2", "--fail-on-attempt", "2"))})
    await sup.start(failing)
    final = await asyncio.wait_for(sup.wait("job-1"), 15)
    assert final is not None and final.end is GangEnd.FAILED


async def test_a_rank_that_cannot_start_stops_the_ranks_that_did(tmp_path: Path) -> None:
    events = Recorder()
    sup = Supervisor(events, tmp_path / "run", kill_grace=2.0)
    (tmp_path / "logs" / "job-1" / "rank-1.log").mkdir(parents=True)  # rank 1 cannot open its log
    result = await sup.start(assignment(tmp_path, UNTIL_STOPPED, ranks=2))
    assert not result.ok
    assert list(result.pids) == [0] and list(result.failed) == [1]
    outcome = await asyncio.wait_for(sup.wait("job-1"), 10)
    assert outcome is not None and outcome.end is GangEnd.FAILED
    assert (outcome.failed_rank, outcome.failed_exit_code) == (1, None)
    assert [c["rank"] for c in events.of("start_failed")] == [1]
    assert [(c["rank"], c["reason"]) for c in events.of("exited")] == [(0, ExitReason.GANG_KILLED)]


async def test_a_gang_whose_first_rank_cannot_start_ends_at_once(tmp_path: Path) -> None:
    events = Recorder()
    sup = Supervisor(events, tmp_path / "run")
    a = assignment(tmp_path, (str(tmp_path / "no-such-program"),), ranks=2)  # (a missing workdir runs elsewhere)
    result = await sup.start(a)
    assert result.pids == {} and list(result.failed) == [0]
    # ends at once: within a few of the stepd's polls (a clean-clone CI run under xdist saw the
    # job still listed right after `start` returned; the end is reported asynchronously)
    await wait_for(lambda: sup.running_jobs() == [] and bool(events.of("ended")), 5.0)
    [ended] = events.of("ended")
    assert ended["outcome"].end is GangEnd.FAILED


async def test_a_redelivered_reservation_does_not_start_the_gang_twice(tmp_path: Path) -> None:
    sup = Supervisor(Recorder(), tmp_path / "run")
    a = assignment(tmp_path, UNTIL_STOPPED, ranks=1)
    first = await sup.start(a)
    second = await sup.start(a)
    assert second.already_running and second.pids == first.pids
    outcome = await sup.stop("job-1", grace_seconds=2)
    assert outcome is not None and outcome.end is GangEnd.STOPPED
    assert outcome.exits == {0: -15}
    late = await sup.start(a)  # redelivered after the attempt ended: not relaunched
    assert late.already_ended and sup.running_jobs() == []
    assert await sup.preempt("job-1", grace_seconds=1) == outcome


async def test_a_failing_event_callback_does_not_stop_supervision(tmp_path: Path) -> None:
    class Broken(Recorder):
        async def worker_started(self, job_id: str, rank: int, pid: int, attempt: int, *, at: float,
                                 cause: str | None) -> None:
            raise RuntimeError("bus is down")

    events = Broken()
    sup = Supervisor(events, tmp_path / "run")
    await sup.start(assignment(tmp_path, (PY, "-c", "pass"), ranks=2))
    outcome = await asyncio.wait_for(sup.wait("job-1"), 10)
    assert outcome is not None and outcome.end is GangEnd.COMPLETED
    assert len(events.of("exited")) == 2


async def test_a_killed_stepd_has_its_ranks_killed_and_reported_as_crashed(tmp_path: Path) -> None:
    events = Recorder()
    sup = Supervisor(events, tmp_path / "run")
    await sup.start(assignment(tmp_path, UNTIL_STOPPED, ranks=2))
    pids = sup.pids("job-1")
    stepd = sup.stepd_pid("job-1")
    assert stepd is not None and len(pids) == 2
    os.kill(stepd, signal.SIGKILL)
    outcome = await asyncio.wait_for(sup.wait("job-1"), 10)
    assert outcome is not None and outcome.end is GangEnd.FAILED
    assert [(c["rank"], c["reason"], c["exit_code"]) for c in events.of("exited")] == [
        (0, ExitReason.CRASHED, None), (1, ExitReason.CRASHED, None)]
    assert "stepd" in events.of("exited")[0]["message"]
    await exited(pids.values())


async def test_a_second_supervisor_adopts_a_detached_gang_and_reports_it_again(tmp_path: Path) -> None:
    first = Supervisor(Recorder(), tmp_path / "run")
    started = await first.start(assignment(tmp_path, UNTIL_STOPPED, ranks=1))
    await first.detach()
    assert all(alive(pid) for pid in started.pids.values())
    events = Recorder()
    second = Supervisor(events, tmp_path / "run")
    [adopted] = await second.adopt()
    assert (adopted.job_id, adopted.attempt, adopted.running) == ("job-1", 0, True)
    assert second.running_jobs() == ["job-1"]
    await wait_for(lambda: len(events.of("started")) == 1)
    assert events.of("started")[0]["pid"] == started.pids[0]
    late = await second.start(assignment(tmp_path, UNTIL_STOPPED, ranks=1))  # a redelivered reservation
    assert late.already_running
    outcome = await second.stop("job-1", grace_seconds=2)
    assert outcome is not None and outcome.end is GangEnd.STOPPED and outcome.exits == {0: -15}
    assert is_reported(tmp_path / "run" / "job-1.attempt-0")
    assert await Supervisor(Recorder(), tmp_path / "run").adopt() == []  # nothing left to report


async def test_an_attempt_in_a_folder_of_its_job_is_adopted_and_not_launched_again(tmp_path: Path) -> None:
    """The nested layout (`run/<job>/attempt-<N>`, an agent of before the flat run folder): its
    attempts are adopted and reported, and a reservation for one of them is not launched again."""
    first = Supervisor(Recorder(), tmp_path / "run")
    a = assignment(tmp_path, (PY, "-c", "import time; time.sleep(0.3)"), ranks=1)
    await first.start(a)
    await first.detach()
    flat = tmp_path / "run" / "job-1.attempt-0"
    await wait_for(lambda: (read_state(flat) or {}).get("phase") == "ended")
    (tmp_path / "run" / "job-1").mkdir()
    flat.rename(tmp_path / "run" / "job-1" / "attempt-0")
    events = Recorder()
    second = Supervisor(events, tmp_path / "run")
    [adopted] = await second.adopt()
    assert (adopted.job_id, adopted.attempt, adopted.running) == ("job-1", 0, False)
    await wait_for(lambda: len(events.of("ended")) == 1)
    assert [(c["rank"], c["exit_code"]) for c in events.of("exited")] == [(0, 0)]
    assert (await second.start(a)).already_ended
    assert not flat.exists()
    # it completed: reported, then removed (its job's folder too), and still known as launched here
    await wait_for(lambda: not (tmp_path / "run" / "job-1").exists())
    assert (await second.start(a)).already_ended


async def test_a_process_rank_starts_in_its_workdir_or_says_why_not(tmp_path: Path) -> None:
    """The spec's workdir (`corral submit` fills in the submitter's folder); a folder this
    node does not have is no reason not to run, as for slurmstepd: the rank log says so."""
    here = tmp_path / "project"
    here.mkdir()
    events = Recorder()
    sup = Supervisor(events, tmp_path / "run")
    pwd = (PY, "-c", "import os; print('cwd', os.getcwd())")
    await sup.start(assignment(tmp_path, pwd, ranks=1, job_id="in-dir", workdir=here))
    await sup.start(assignment(tmp_path, pwd, ranks=1, job_id="no-dir", workdir=tmp_path / "elsewhere"))
    for job in ("in-dir", "no-dir"):
        outcome = await sup.wait(job)
        assert outcome is not None and outcome.end is GangEnd.COMPLETED
    assert f"cwd {here}\n" in (tmp_path / "logs" / "in-dir" / "rank-0.log").read_text()
    missing = (tmp_path / "logs" / "no-dir" / "rank-0.log").read_text()
    assert f"workdir {tmp_path / 'elsewhere'} does not exist on this node" in missing
    await sup.close()


FAKE_DOCKER = """\
#!{python}
# A container engine stand-in: `run` records its container and waits like a client does (the
# container outlives a SIGKILLed client); `rm --force` fails while rm-failures says so;
# `container inspect` answers whether the container is there.
import os, signal, sys
state = {state!r}
args = sys.argv[1:]
if args[0] == "run":
    name = args[args.index("--name") + 1]
    open(os.path.join(state, name), "w").close()
    signal.pause()
elif args[0] == "rm":
    failures = os.path.join(state, "rm-failures")
    left = int(open(failures).read()) if os.path.exists(failures) else 0
    if left > 0:
        open(failures, "w").write(str(left - 1))
        sys.exit(1)
    if os.path.exists(os.path.join(state, args[-1])):
        os.remove(os.path.join(state, args[-1]))
elif args[:2] == ["container", "inspect"]:
    sys.exit(0 if os.path.exists(os.path.join(state, args[-1])) else 1)
"""


async def test_a_container_left_behind_keeps_its_rank_running_until_it_is_removed(
        tmp_path: Path, monkeypatch: Any) -> None:
    """The review: after a SIGKILL of the docker client, `docker rm --force` ran once and any
    failure was swallowed: the rank was reported exited (its GPUs free) while the container ran
    on. Now the rank ends only once the engine says the container is gone."""
    state, bin_dir = tmp_path / "engine", tmp_path / "bin"
    state.mkdir()
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(FAKE_DOCKER.format(python=PY, state=str(state)))
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    events = Recorder()
    left_at_exit: list[bool] = []
    exited = events.worker_exited

    async def worker_exited(*args: Any, **kwargs: Any) -> None:
        left_at_exit.append(any(p.name.startswith("corral-") for p in state.iterdir()))
        await exited(*args, **kwargs)

    events.worker_exited = worker_exited  # type: ignore[method-assign]
    sup = Supervisor(events, tmp_path / "run")
    await sup.start(assignment(tmp_path, ("train",), ranks=1, runtime="docker", image="registry.local/img:1"))
    await wait_for(lambda: any(p.name.startswith("corral-") for p in state.iterdir()))
    (state / "rm-failures").write_text("3")  # the engine refuses the first three removals
    outcome = await sup.preempt("job-1", grace_seconds=0.3)
    assert outcome is not None and outcome.end is GangEnd.PREEMPTED
    assert left_at_exit == [False]  # reported exited only once the container was gone
    assert (state / "rm-failures").read_text() == "0"
