"""The `sim-timer` runtime: simulated ranks as asyncio timers inside the agent, no processes.

Why: the `sim` runtime starts one `python -m corral.worker sim` process per rank, faithful down to
signals and control files, but each start costs tens of milliseconds of CPU. A benchmark that
places hundreds of gangs per second on a small machine would then measure Python's start-up, not
the scheduler. This supervisor keeps the agent's contract — WorkerStarted for every rank,
WorkerExited with the same codes (0 completed, 85 checkpointed, -15 stopped), CheckpointDone from
rank 0 when preempted — and replaces the processes by one timer per gang.

Same public surface as `Supervisor` as far as `NodeAgent` uses it: `start`, `preempt`, `stop`,
`send_preempt`, `send_stop`, `close`, `detach`, `adopt`, `running_jobs`, `running_attempt`. Not
simulated: crashes (`CORRAL_SIM_ARGS --fail-at-step`), periodic checkpoints, rank logs; use the
`sim` runtime to exercise those.

Not survivable: the timers live in the agent process, so a `kill -9` or a graceful stop of the
agent ends them without a report, and `adopt` finds nothing. Placement, no longer seeing those
jobs in the node's heartbeats, releases and requeues them. Use `sim` to test agent restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal as signal_module
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from corral.contracts.worker import CHECKPOINTED_EXIT_CODE

from .assignment import Assignment
from .control import CheckpointReport
from .supervisor import AdoptedGang, AgentEvents, ExitReason, GangEnd, GangOutcome, GangStart

STEP_SECONDS = 0.1  # the sim worker's default step: checkpoints count whole steps
_ENDED_KEPT = 4096


def sim_duration(command: tuple[str, ...]) -> float:
    """The `--duration` of a sim command (see `assignment.sim_command`); 0 when absent."""
    for flag, value in itertools.pairwise(command):
        if flag == "--duration":
            return float(value)
    return 0.0


def resumed_step(resume_from: Path | None) -> int:
    """The step a previous attempt checkpointed (`{"step": n}`), or 0."""
    if resume_from is None:
        return 0
    try:
        return int(json.loads(resume_from.read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


@dataclass
class _TimerGang:
    assignment: Assignment
    started_at: float
    first_step: int
    cause: str | None = None
    timer: asyncio.Task[None] | None = None
    ended: asyncio.Future[GangOutcome] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class TimerSupervisor:
    """Every gang of one node as a timer; reports through `events` like the process supervisor."""

    def __init__(self, events: AgentEvents) -> None:
        self._events = events
        self._gangs: dict[str, _TimerGang] = {}
        self._ended: OrderedDict[str, GangOutcome] = OrderedDict()
        self._tasks: set[asyncio.Task[GangOutcome | None]] = set()

    def running_jobs(self) -> list[str]:
        return sorted(self._gangs)

    def running_attempt(self, job_id: str) -> int | None:
        gang = self._gangs.get(job_id)
        return gang.assignment.attempt if gang else None

    async def adopt(self) -> list[AdoptedGang]:
        """Nothing survives the agent here (see the module doc)."""
        return []

    async def detach(self) -> None:
        """A graceful agent stop: the timers end with the agent, unreported (see the module doc)."""
        for gang in list(self._gangs.values()):
            self._cancel_timer(gang)
        self._gangs.clear()

    def send_preempt(self, job_id: str, grace_seconds: float, signal: str | None = None, *,
                     cause: str | None = None) -> bool:
        if job_id not in self._gangs:
            return False
        self._gangs[job_id].cause = cause or self._gangs[job_id].cause
        self._keep(asyncio.get_running_loop().create_task(self.preempt(job_id, grace_seconds, signal)))
        return True

    def _keep(self, task: asyncio.Task[GangOutcome | None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def send_stop(self, job_id: str, grace_seconds: float, *, cause: str | None = None) -> bool:
        if job_id not in self._gangs:
            return False
        self._gangs[job_id].cause = cause or self._gangs[job_id].cause
        self._keep(asyncio.get_running_loop().create_task(self.stop(job_id, grace_seconds)))
        return True

    async def start(self, assignment: Assignment, *, cause: str | None = None, wait: bool = True) -> GangStart:
        pid = os.getpid()  # the ranks live in the agent process
        existing = self._gangs.get(assignment.job_id)
        if existing is not None:
            if existing.assignment.attempt != assignment.attempt:
                raise RuntimeError(f"job {assignment.job_id}: attempt {existing.assignment.attempt} still "
                                   f"runs here; stop it before starting attempt {assignment.attempt}")
            return GangStart(assignment.job_id, assignment.attempt, {r.rank: pid for r in assignment.ranks}, {},
                             already_running=True)
        previous = self._ended.get(assignment.job_id)
        if previous is not None and previous.attempt >= assignment.attempt:
            return GangStart(assignment.job_id, assignment.attempt, {}, {}, already_ended=True)
        loop = asyncio.get_running_loop()
        first = resumed_step(assignment.resume_from)
        gang = _TimerGang(assignment, loop.time(), first, cause)
        self._gangs[assignment.job_id] = gang
        now = time.time()
        for rank in assignment.ranks:
            await self._events.worker_started(assignment.job_id, rank.rank, pid, assignment.attempt, at=now,
                                              cause=cause)
        total_steps = max(1, round(sim_duration(assignment.command) / STEP_SECONDS))
        remaining = max(0, total_steps - first) * STEP_SECONDS
        gang.timer = asyncio.create_task(self._complete_after(gang, remaining))
        return GangStart(assignment.job_id, assignment.attempt, {r.rank: pid for r in assignment.ranks}, {})

    async def _complete_after(self, gang: _TimerGang, seconds: float) -> None:
        await asyncio.sleep(seconds)
        await self._end(gang, GangEnd.COMPLETED, 0, ExitReason.COMPLETED)

    async def preempt(self, job_id: str, grace_seconds: float, signal: str | None = None, *,
                      cause: str | None = None) -> GangOutcome | None:
        """Checkpoint at the current step (rank 0 writes `{"step": n}`), then every rank exits 85."""
        gang = self._gangs.get(job_id)
        if gang is None:
            return self._ended.get(job_id)
        gang.cause = cause or gang.cause
        self._cancel_timer(gang)
        a = gang.assignment
        step = gang.first_step + int((asyncio.get_running_loop().time() - gang.started_at) / STEP_SECONDS)
        path = a.checkpoint_dir / f"attempt-{a.attempt}" / "sim-step.json"
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"step": step}))
        report = CheckpointReport(rank=0, attempt=a.attempt, path=path, step=step)
        if any(r.rank == 0 for r in a.ranks):
            await self._events.checkpoint_done(job_id, path, step, 0, a.attempt, at=time.time(), cause=gang.cause)
        return await self._end(gang, GangEnd.PREEMPTED, CHECKPOINTED_EXIT_CODE, ExitReason.CHECKPOINTED, report)

    async def stop(self, job_id: str, grace_seconds: float, *, cause: str | None = None) -> GangOutcome | None:
        gang = self._gangs.get(job_id)
        if gang is None:
            return None
        gang.cause = cause or gang.cause
        self._cancel_timer(gang)
        return await self._end(gang, GangEnd.STOPPED, -int(signal_module.SIGTERM), ExitReason.STOPPED)

    async def close(self, grace_seconds: float = 2.0) -> None:
        for job_id in list(self._gangs):
            await self.stop(job_id, grace_seconds)

    def _cancel_timer(self, gang: _TimerGang) -> None:
        if gang.timer is not None and gang.timer is not asyncio.current_task():
            gang.timer.cancel()

    async def _end(self, gang: _TimerGang, end: GangEnd, code: int, reason: ExitReason,
                   checkpoint: CheckpointReport | None = None) -> GangOutcome:
        a = gang.assignment
        if self._gangs.get(a.job_id) is not gang:  # ended already (a stop racing the timer)
            return await asyncio.shield(gang.ended)
        del self._gangs[a.job_id]
        now = time.time()
        for rank in a.ranks:
            await self._events.worker_exited(a.job_id, rank.rank, code, a.attempt, reason, at=now, cause=gang.cause)
        outcome = GangOutcome(job_id=a.job_id, attempt=a.attempt, end=end, exits={r.rank: code for r in a.ranks},
                              checkpoint=checkpoint, resume_from=a.resume_from)
        self._ended[a.job_id] = outcome
        self._ended.move_to_end(a.job_id)
        while len(self._ended) > _ENDED_KEPT:
            self._ended.popitem(last=False)
        gang.ended.set_result(outcome)
        await self._events.gang_ended(outcome)
        return outcome
