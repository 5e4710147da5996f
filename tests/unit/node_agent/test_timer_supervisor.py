from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

from corral.services.node_agent.process.assignment import Assignment, RankAssignment, sim_command
from corral.services.node_agent.process.supervisor import ExitReason, GangEnd, GangOutcome
from corral.services.node_agent.process.timer_supervisor import TimerSupervisor


class Recorder:
    """The AgentEvents a node agent would turn into WorkerStarted / WorkerExited / CheckpointDone."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []
        self.outcomes: list[GangOutcome] = []

    async def worker_started(self, job_id: str, rank: int, pid: int, attempt: int, *, at: float,
                             cause: str | None) -> None:
        self.calls.append(("started", rank, attempt))

    async def worker_exited(self, job_id: str, rank: int, exit_code: int | None, attempt: int,
                            reason: ExitReason, *, at: float, cause: str | None, message: str = "") -> None:
        self.calls.append(("exited", rank, exit_code, reason))

    async def checkpoint_done(self, job_id: str, path: Path, step: int, rank: int, attempt: int, *, at: float,
                              cause: str | None) -> None:
        self.calls.append(("checkpoint", rank, step, path))

    async def gang_ended(self, outcome: GangOutcome) -> None:
        self.outcomes.append(outcome)


def _gang(tmp_path: Path, duration: float, **changes: object) -> Assignment:
    base = Assignment(job_id="j1", attempt=1, world_size=2, node_rank=0, master_addr="127.0.0.1",
                      master_port=29500, ranks=(RankAssignment(0, 0, (0,)), RankAssignment(1, 1, (1,))),
                      command=sim_command(duration, python="python"), checkpoint_dir=tmp_path / "ckpt",
                      log_dir=tmp_path / "logs")
    return dataclasses.replace(base, **changes)


async def test_timer_gang_reports_every_rank_started_then_exited_zero_after_its_duration(tmp_path: Path) -> None:
    events = Recorder()
    supervisor = TimerSupervisor(events)
    started = await supervisor.start(_gang(tmp_path, 0.2))
    assert started.ok and set(started.pids) == {0, 1}
    assert supervisor.running_attempt("j1") == 1
    for _ in range(100):
        if events.outcomes:
            break
        await asyncio.sleep(0.02)
    assert events.calls == [("started", 0, 1), ("started", 1, 1),
                            ("exited", 0, 0, ExitReason.COMPLETED), ("exited", 1, 0, ExitReason.COMPLETED)]
    assert events.outcomes[0].end is GangEnd.COMPLETED and supervisor.running_jobs() == []
    again = await supervisor.start(_gang(tmp_path, 0.2))
    assert again.already_ended  # a redelivered reservation is not run twice


async def test_preempted_timer_gang_checkpoints_its_step_and_the_next_attempt_resumes_there(tmp_path: Path) -> None:
    events = Recorder()
    supervisor = TimerSupervisor(events)
    await supervisor.start(_gang(tmp_path, 60))
    await asyncio.sleep(0.25)
    outcome = await supervisor.preempt("j1", grace_seconds=10)
    assert outcome is not None and outcome.end is GangEnd.PREEMPTED
    (kind, rank, step, path), *exits = events.calls[2:]
    assert kind == "checkpoint" and rank == 0 and isinstance(step, int) and step >= 2
    assert json.loads(Path(str(path)).read_text()) == {"step": step}
    assert exits == [("exited", 0, 85, ExitReason.CHECKPOINTED), ("exited", 1, 85, ExitReason.CHECKPOINTED)]
    resumed = _gang(tmp_path, 60, attempt=2, resume_from=Path(str(path)))
    await supervisor.start(resumed)
    stopped = await supervisor.stop("j1", grace_seconds=1)
    assert stopped is not None and stopped.end is GangEnd.STOPPED
    assert events.calls[-1] == ("exited", 1, -15, ExitReason.STOPPED)
