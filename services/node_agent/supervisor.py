"""Runs a node's share of gangs as real processes: launch, watch, preempt, tear down.

Why a separate, bus-free class: everything here is about processes and signals, and it must be
testable with real processes but without NATS. The node-agent service is a thin adapter: it turns
GangReserved / PreemptRequested events into `start` / `preempt` calls and the `AgentEvents`
callbacks back into WorkerStarted / WorkerExited / CheckpointDone events.

Every rank runs in its own process group (its own session), so a signal reaches the rank and
everything it spawned (data loaders, torchrun children) and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import signal as signal_module
import time
from collections import OrderedDict
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from corral.worker import CHECKPOINTED_EXIT_CODE, signal_from_name

from .assignment import Assignment, RankAssignment, build_rank_env, rank_log_path
from .control import CheckpointReport, ControlChannel

log = logging.getLogger(__name__)

_ENDED_KEPT = 4096


class ExitReason(enum.StrEnum):
    """Why a rank's process ended, as reported in WorkerExited."""

    COMPLETED = "completed"  # exit 0
    CHECKPOINTED = "checkpointed"  # exit 85 (CHECKPOINTED_EXIT_CODE)
    CRASHED = "crashed"  # any other exit outside a preemption / stop
    PREEMPTED = "preempted"  # ended during a preemption without the checkpointed code
    GANG_KILLED = "gang_killed"  # ended after a peer rank crashed or could not start
    STOPPED = "stopped"  # ended by `stop()` (gang released, job cancelled, node draining)


class GangEnd(enum.StrEnum):
    """How one attempt of a gang ended on this node."""

    COMPLETED = "completed"  # every rank exited 0
    CHECKPOINTED = "checkpointed"  # ranks stopped on their own after a checkpoint (0/85, some 85)
    PREEMPTED = "preempted"  # ended by `preempt()`; `checkpoint` says where to resume
    FAILED = "failed"  # a rank crashed or could not start (placement decides restart or fail)
    STOPPED = "stopped"  # ended by `stop()`


@dataclass(frozen=True)
class GangOutcome:
    """The end of one attempt of a gang on this node.

    `exits` maps global rank -> exit code (negative: killed by that signal; missing: never
    started). `checkpoint` is the newest checkpoint known for the job (a report from this attempt,
    lowest rank first, else the one it resumed from).
    """

    job_id: str
    attempt: int
    end: GangEnd
    exits: Mapping[int, int]
    checkpoint: CheckpointReport | None
    resume_from: Path | None
    failed_rank: int | None = None
    failed_exit_code: int | None = None


@dataclass(frozen=True)
class GangStart:
    """What `start` did: the ranks it started (rank -> pid) and those that could not start."""

    job_id: str
    attempt: int
    pids: Mapping[int, int]
    failed: Mapping[int, str]
    already_running: bool = False
    already_ended: bool = False  # a redelivered reservation for an attempt that has ended: not relaunched

    @property
    def ok(self) -> bool:
        return not self.failed


class AgentEvents(Protocol):
    """What the supervisor reports; the service adapter publishes these as events."""

    async def worker_started(self, job_id: str, rank: int, pid: int, attempt: int) -> None: ...

    async def worker_start_failed(self, job_id: str, rank: int, attempt: int, message: str) -> None: ...

    async def worker_exited(self, job_id: str, rank: int, exit_code: int, attempt: int,
                            reason: ExitReason) -> None: ...

    async def checkpoint_done(self, job_id: str, path: Path, step: int, rank: int, attempt: int) -> None: ...

    async def gang_ended(self, outcome: GangOutcome) -> None: ...


class _State(enum.Enum):
    RUNNING = "running"
    PREEMPTING = "preempting"
    FAILING = "failing"
    STOPPING = "stopping"


@dataclass
class _Rank:
    spec: RankAssignment
    process: asyncio.subprocess.Process
    log_file: IO[bytes]
    control: ControlChannel
    exit_code: int | None = None
    report: CheckpointReport | None = None


@dataclass
class _Gang:
    assignment: Assignment
    ranks: dict[int, _Rank] = field(default_factory=dict)
    state: _State = _State.RUNNING
    failed_rank: int | None = None
    failed_exit_code: int | None = None
    start_failed: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Future[GangOutcome] | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def live(self) -> list[_Rank]:
        return [r for r in self.ranks.values() if r.exit_code is None]

    def newest_report(self) -> CheckpointReport | None:
        reports = [r.report for r in self.ranks.values() if r.report is not None]
        return min(reports, key=lambda rep: rep.rank) if reports else None


class Supervisor:
    """The processes of every gang this node runs, keyed by job id (one attempt at a time).

    `run_dir` holds the per-attempt control files. `kill_grace` bounds how long crashed-gang and
    `stop()` teardown waits between SIGTERM and SIGKILL.
    """

    def __init__(self, events: AgentEvents, run_dir: Path, *, kill_grace: float = 5.0,
                 poll_interval: float = 0.05, base_env: Mapping[str, str] | None = None) -> None:
        self._events = events
        self._run_dir = run_dir
        self._kill_grace = kill_grace
        self._poll_interval = poll_interval
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._gangs: dict[str, _Gang] = {}
        self._ended: OrderedDict[str, GangOutcome] = OrderedDict()  # newest outcome per job, bounded

    @staticmethod
    async def _emit(call: Awaitable[None]) -> None:
        """Await one `AgentEvents` call. A failing callback is a bug in the adapter; it is logged
        and must not stop the supervisor from watching (and eventually killing) the processes."""
        try:
            await call
        except Exception:
            log.exception("an AgentEvents callback failed")

    # --- queries -------------------------------------------------------------------------------

    def running_jobs(self) -> list[str]:
        return sorted(self._gangs)

    def running_attempt(self, job_id: str) -> int | None:
        """The attempt of `job_id` that runs here now, or None."""
        gang = self._gangs.get(job_id)
        return gang.assignment.attempt if gang else None

    def pids(self, job_id: str) -> dict[int, int]:
        """Global rank -> pid of the live ranks of a job (empty if it does not run here)."""
        gang = self._gangs.get(job_id)
        return {r.spec.rank: r.process.pid for r in gang.live()} if gang else {}

    def last_outcome(self, job_id: str) -> GangOutcome | None:
        """How the newest ended attempt of `job_id` ended here (recent jobs only)."""
        return self._ended.get(job_id)

    async def wait(self, job_id: str) -> GangOutcome | None:
        """Wait for the current attempt of `job_id` to end; if none runs, its last outcome (or None)."""
        gang = self._gangs.get(job_id)
        if gang is None or gang.ended is None:
            return self._ended.get(job_id)
        return await asyncio.shield(gang.ended)

    # --- start ---------------------------------------------------------------------------------

    async def start(self, assignment: Assignment) -> GangStart:
        """Start every local rank of `assignment` as its own process group.

        Idempotent for the same (job, attempt): a redelivered reservation returns the running one,
        and one for an attempt that already ended here is not relaunched (`already_ended`).
        A rank that cannot be spawned makes the whole local gang stop (reported as FAILED with a
        restart decision), since its peers would block forever in their first collective.
        """
        existing = self._gangs.get(assignment.job_id)
        if existing is not None:
            if existing.assignment.attempt != assignment.attempt:
                raise RuntimeError(f"job {assignment.job_id}: attempt {existing.assignment.attempt} still "
                                   f"runs here; stop it before starting attempt {assignment.attempt}")
            return GangStart(assignment.job_id, assignment.attempt,
                             {r.spec.rank: r.process.pid for r in existing.ranks.values()}, {},
                             already_running=True)
        previous = self._ended.get(assignment.job_id)
        if previous is not None and previous.attempt >= assignment.attempt:
            return GangStart(assignment.job_id, assignment.attempt, {}, {}, already_ended=True)
        gang = _Gang(assignment=assignment, ended=asyncio.get_running_loop().create_future())
        self._gangs[assignment.job_id] = gang
        control_dir = self._run_dir / assignment.job_id / f"attempt-{assignment.attempt}"
        control_dir.mkdir(parents=True, exist_ok=True)
        failed: dict[int, str] = {}
        for spec in assignment.ranks:
            try:
                rank = await self._spawn(assignment, spec, control_dir / f"rank-{spec.rank}.control")
            except OSError as exc:
                failed[spec.rank] = f"{type(exc).__name__}: {exc}"
                await self._emit(self._events.worker_start_failed(
                    assignment.job_id, spec.rank, assignment.attempt, failed[spec.rank]))
                break
            gang.ranks[spec.rank] = rank
            await self._emit(self._events.worker_started(
                assignment.job_id, spec.rank, rank.process.pid, assignment.attempt))
        pids = {r.spec.rank: r.process.pid for r in gang.ranks.values()}
        if failed:
            gang.start_failed = True
            gang.failed_rank = next(iter(failed))
            gang.state = _State.FAILING
        for rank in gang.ranks.values():
            gang.tasks.append(asyncio.create_task(self._watch_rank(gang, rank)))
        gang.tasks.append(asyncio.create_task(self._poll_control(gang)))
        if failed:
            if gang.ranks:
                gang.tasks.append(asyncio.create_task(self._terminate(gang, self._kill_grace)))
            else:
                await self._finish(gang)
        return GangStart(assignment.job_id, assignment.attempt, pids, failed)

    async def _spawn(self, assignment: Assignment, spec: RankAssignment, control: Path) -> _Rank:
        log_path = rank_log_path(assignment, spec)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = log_path.open("ab")
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        log_file.write(f"==== corral job {assignment.job_id} attempt {assignment.attempt} rank {spec.rank} "
                       f"node_rank {assignment.node_rank} started {stamp} ====\n".encode())
        log_file.flush()
        env = build_rank_env(assignment, spec, control, self._base_env)
        try:
            process = await asyncio.create_subprocess_exec(
                *assignment.command, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=log_file,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True,
                cwd=str(assignment.workdir) if assignment.workdir else None)
        except OSError as exc:
            log_file.write(f"==== could not start: {exc} ====\n".encode())
            log_file.close()
            raise
        return _Rank(spec=spec, process=process, log_file=log_file, control=ControlChannel(control))

    # --- watching ------------------------------------------------------------------------------

    async def _watch_rank(self, gang: _Gang, rank: _Rank) -> None:
        code = await rank.process.wait()
        await self._drain_control(gang)
        rank.exit_code = code
        rank.log_file.write(f"==== exited with code {code} ====\n".encode())
        rank.log_file.close()
        _signal_group(rank.process.pid, signal_module.SIGKILL)  # leftovers the rank spawned
        reason = self._classify(gang, rank, code)
        gang.changed.set()
        await self._emit(self._events.worker_exited(
            gang.assignment.job_id, rank.spec.rank, code, gang.assignment.attempt, reason))
        if reason is ExitReason.CRASHED and gang.state is _State.RUNNING:
            gang.state = _State.FAILING
            gang.failed_rank, gang.failed_exit_code = rank.spec.rank, code
            gang.tasks.append(asyncio.create_task(self._terminate(gang, self._kill_grace)))
        if not gang.live():
            await self._finish(gang)

    @staticmethod
    def _classify(gang: _Gang, rank: _Rank, code: int) -> ExitReason:
        if code == 0:
            return ExitReason.COMPLETED
        if code == CHECKPOINTED_EXIT_CODE:
            return ExitReason.CHECKPOINTED
        if gang.state is _State.PREEMPTING:
            return ExitReason.PREEMPTED
        if gang.state is _State.STOPPING:
            return ExitReason.STOPPED
        if gang.state is _State.FAILING:
            return ExitReason.GANG_KILLED  # the peers of a crashed rank die of it one way or another
        return ExitReason.CRASHED

    async def _poll_control(self, gang: _Gang) -> None:
        while gang.live():
            await self._drain_control(gang)
            await asyncio.sleep(self._poll_interval)

    async def _drain_control(self, gang: _Gang) -> None:
        for rank in gang.ranks.values():
            for report in rank.control.read_new():
                if report.attempt != gang.assignment.attempt:
                    continue
                rank.report = report
                gang.changed.set()
                await self._emit(self._events.checkpoint_done(
                    gang.assignment.job_id, report.path, report.step, report.rank, report.attempt))

    async def _finish(self, gang: _Gang) -> None:
        a = gang.assignment
        if self._gangs.get(a.job_id) is not gang or gang.ended is None or gang.ended.done():
            return
        del self._gangs[a.job_id]
        exits = {r.spec.rank: r.exit_code for r in gang.ranks.values() if r.exit_code is not None}
        report = gang.newest_report()
        resume_from = report.path if report else a.resume_from
        if gang.state is _State.FAILING:
            end = GangEnd.FAILED
        elif all(code == 0 for code in exits.values()):
            end = GangEnd.COMPLETED
        elif gang.state is _State.PREEMPTING:
            end = GangEnd.PREEMPTED
        elif gang.state is _State.STOPPING:
            end = GangEnd.STOPPED
        else:
            end = GangEnd.CHECKPOINTED
        outcome = GangOutcome(job_id=a.job_id, attempt=a.attempt, end=end, exits=exits, checkpoint=report,
                              resume_from=resume_from, failed_rank=gang.failed_rank,
                              failed_exit_code=gang.failed_exit_code)
        gang.ended.set_result(outcome)
        self._ended.pop(a.job_id, None)
        self._ended[a.job_id] = outcome
        while len(self._ended) > _ENDED_KEPT:
            self._ended.popitem(last=False)
        await self._emit(self._events.gang_ended(outcome))

    # --- preemption and teardown ---------------------------------------------------------------

    async def preempt(self, job_id: str, grace_seconds: float, signal: str | None = None, *,
                      exit_after_report: float = 2.0) -> GangOutcome | None:
        """Ask the job's ranks to checkpoint and stop, then make sure they do by the deadline.

        1. send `signal` (default: the job's checkpoint signal, SIGUSR1) to every rank's group;
        2. wait until each rank reported a checkpoint or exited, then up to `exit_after_report`
           seconds for reporting ranks to exit by themselves;
        3. SIGTERM the survivors when that is over, or at the latest `min(5s, 20% of grace)` before
           the deadline;
        4. SIGKILL whatever is left at the deadline.

        Returns the outcome: PREEMPTED, or whatever ended it first (e.g. CHECKPOINTED when a peer
        node's signal made these ranks checkpoint and stop before this call); for a job that no
        longer runs here, its last outcome, or None if it never ran here.
        """
        gang = self._gangs.get(job_id)
        if gang is None or gang.ended is None:
            return self._ended.get(job_id)
        if gang.state is not _State.RUNNING:
            return await asyncio.shield(gang.ended)
        gang.state = _State.PREEMPTING
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_seconds
        term_at = deadline - min(5.0, 0.2 * grace_seconds)
        sig = signal_from_name(signal or gang.assignment.checkpoint_signal)
        for rank in gang.live():
            _signal_group(rank.process.pid, sig)
        await self._wait_until(gang, lambda: all(r.report is not None for r in gang.live()), term_at)
        await self._wait_until(gang, lambda: not gang.live(), min(term_at, loop.time() + exit_after_report))
        await self._escalate(gang, deadline)
        return await asyncio.shield(gang.ended)

    async def stop(self, job_id: str, grace_seconds: float) -> GangOutcome | None:
        """SIGTERM the job's ranks, SIGKILL them after `grace_seconds` (gang released, job cancelled)."""
        gang = self._gangs.get(job_id)
        if gang is None or gang.ended is None:
            return None
        if gang.state is _State.RUNNING:
            gang.state = _State.STOPPING
        await self._terminate(gang, grace_seconds)
        return await asyncio.shield(gang.ended)

    async def close(self, grace_seconds: float = 2.0) -> None:
        """Stop every gang (agent shutdown)."""
        await asyncio.gather(*(self.stop(job_id, grace_seconds) for job_id in list(self._gangs)))

    async def _terminate(self, gang: _Gang, grace_seconds: float) -> None:
        for rank in gang.live():
            _signal_group(rank.process.pid, signal_module.SIGTERM)
        await self._escalate(gang, asyncio.get_running_loop().time() + grace_seconds, term=False)

    async def _escalate(self, gang: _Gang, deadline: float, *, term: bool = True) -> None:
        if term:
            for rank in gang.live():
                _signal_group(rank.process.pid, signal_module.SIGTERM)
        await self._wait_until(gang, lambda: not gang.live(), deadline)
        for rank in gang.live():
            log.warning("job %s rank %s ignored SIGTERM; SIGKILL", gang.assignment.job_id, rank.spec.rank)
            _signal_group(rank.process.pid, signal_module.SIGKILL)
        if gang.ended is not None:
            await asyncio.shield(gang.ended)

    @staticmethod
    async def _wait_until(gang: _Gang, condition: _Condition, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        while not condition():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            gang.changed.clear()
            if condition():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(gang.changed.wait(), remaining)


class _Condition(Protocol):
    def __call__(self) -> bool: ...


def _signal_group(pgid: int, sig: signal_module.Signals) -> None:
    """Signal a rank's process group; a group that is already gone is not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
