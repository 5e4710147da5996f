"""The agent's side of a node's gangs: start a stepd per gang attempt, follow it, command it, adopt it.

Why: ranks that are children of the agent would be orphaned by its death, their exits lost, and
killed by its graceful stop. Each gang attempt runs under its own stepd
(`stepd.py`, its own session): the ranks' truth is the stepd's `state.json` (see `step_files`),
and this class only turns that file into reports and the agent's decisions into commands.

- `start` writes `launch.json`, has the fork server (`zygote`) fork the stepd and waits until it
  has spawned the ranks; the agent's consumer waits for neither (`wait=False`): the gang's watcher
  asks the fork server, so the next job's start is not held up by this one's round trip;
- a watcher task per gang follows `state.json` (one `StatePoller` for all gangs wakes the watcher
  when the kernel says the file changed, or where it cannot, when a look every `poll_interval`
  finds its inode/mtime/size changed) and calls the
  `AgentEvents` callbacks for whatever is new: each report carries the time the stepd recorded,
  so the service builds the same event id from it every time (a report sent twice is one report);
- `preempt` / `stop` append a command and wake the stepd; `send_*` do it without waiting;
- `adopt` (agent start) finds the attempt folders of stepds started by an earlier agent process:
  live ones are followed as if started here, ended ones are reported, a stepd that died without
  finishing has its leftover ranks killed and their exits recorded on its behalf;
- `detach` (graceful agent stop) forgets the stepds and leaves them running; `close` stops them.

When every report of an ended attempt is published (`gang_ended` returned), the folder is marked
reported (its mode, `mark_reported`) and is never reported again; once the log also holds the
attempt's end (`attempts_over`), or at once if every rank of it here exited 0, the folder is
removed (`run_folders`): the log's end of a completed gang is never sent to its nodes (its
JobCompleted, and its GangReleased, are no node's work), and nothing is left to report or stop. Every rank runs in its
own process group, so a signal reaches the rank and everything it spawned and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import signal as signal_module
import subprocess
import sys
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from corral import environment

from .assignment import Assignment
from .control import CheckpointReport
from .fork_server import ForkServer
from .run_folders import RunFolders
from .state_poller import StatePoller
from .step_files import (
    ABANDONED,
    COMMANDS,
    ENDED,
    LAUNCH,
    STARTING,
    STATE,
    STATE_VERSION,
    STEPD_LOG,
    WAKE_SIGNAL,
    Launch,
    abandon,
    attempt_dir,
    attempt_folders,
    create_json,
    file_version,
    is_alive,
    is_reported,
    mark_reported,
    read_commands,
    read_launch,
    read_state,
    read_state_file,
    signal_group,
    write_json,
    write_new_json,
)

log = logging.getLogger(__name__)

_ENDED_KEPT = 4096
_LIVENESS_EVERY = 0.5  # seconds between checks that a stepd still lives
_LAUNCH_WAIT = 5.0  # seconds a graceful stop waits for the stepds being asked for


class ExitReason(enum.StrEnum):
    """Why a rank's process ended, as reported in WorkerExited."""

    COMPLETED = "completed"  # exit 0
    CHECKPOINTED = "checkpointed"  # exit 85 (CHECKPOINTED_EXIT_CODE)
    CRASHED = "crashed"  # any other exit outside a preemption / stop (or its stepd died)
    PREEMPTED = "preempted"  # ended during a preemption without the checkpointed code
    GANG_KILLED = "gang_killed"  # ended (or never started) after a peer rank crashed or could not start
    STOPPED = "stopped"  # ended by `stop()` (gang released, job cancelled, node draining)
    START_FAILED = "start_failed"  # could not be spawned


class GangEnd(enum.StrEnum):
    """How one attempt of a gang ended on this node."""

    COMPLETED = "completed"  # every rank exited 0
    CHECKPOINTED = "checkpointed"  # ranks stopped on their own after a checkpoint (0/85, some 85)
    PREEMPTED = "preempted"  # ended by `preempt()`; `checkpoint` says where to resume
    FAILED = "failed"  # a rank crashed or could not start
    STOPPED = "stopped"  # ended by `stop()`


@dataclass(frozen=True)
class GangOutcome:
    """The end of one attempt of a gang on this node.

    `exits` maps global rank -> exit code (negative: killed by that signal; missing: never
    started or no code known). `checkpoint` is the newest checkpoint of this attempt (lowest rank
    first); `resume_from` that one's path, else the one the attempt resumed from.
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
    already_ended: bool = False  # a redelivered reservation for an attempt launched here before

    @property
    def ok(self) -> bool:
        return not self.failed


@dataclass(frozen=True)
class AdoptedGang:
    """A gang attempt found at `adopt`: `running` if its stepd still supervises live ranks."""

    job_id: str
    attempt: int
    launched_at: float
    running: bool


class AgentEvents(Protocol):
    """What the supervisor reports; the service adapter publishes these as events.

    `at` is the wall-clock time the stepd recorded (the same on every report of the same fact);
    `cause` the id of the event that caused it (the GangReserved, a PreemptRequested, ...).
    """

    async def worker_started(self, job_id: str, rank: int, pid: int, attempt: int, *, at: float,
                             cause: str | None) -> None: ...

    async def worker_exited(self, job_id: str, rank: int, exit_code: int | None, attempt: int,
                            reason: ExitReason, *, at: float, cause: str | None, message: str = "") -> None: ...

    async def checkpoint_done(self, job_id: str, path: Path, step: int, rank: int, attempt: int, *, at: float,
                              cause: str | None) -> None: ...

    async def gang_ended(self, outcome: GangOutcome) -> None: ...


@dataclass(eq=False)
class _Gang:
    folder: Path
    launch: Launch
    proc: subprocess.Popen[bytes] | None = None  # the stepd when this process started it
    stepd_pid: int | None = None
    stepd_started: str | None = None
    shared: bool = False  # the stepd is the node's stepd host, holding other gangs too (`stepd_host`)
    version: tuple[int, int, int] | None = None
    state: dict[str, Any] | None = None
    emitted: set[tuple[Any, ...]] = field(default_factory=set)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    launched: asyncio.Event = field(default_factory=asyncio.Event)  # its stepd was asked for (or adopted)
    ended: asyncio.Future[GangOutcome] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    task: asyncio.Task[None] | None = None
    pending: list[dict[str, Any]] = field(default_factory=list)  # commands the disk refused so far
    state_file: str = field(init=False, default="")  # its state.json (the watcher looks at it every poll)
    over: bool = False  # the log holds this attempt's end: its folder goes once it is reported

    def __post_init__(self) -> None:
        self.state_file = os.path.join(self.folder, STATE)

    @property
    def assignment(self) -> Assignment:
        return self.launch.assignment

    @property
    def phase(self) -> str | None:
        return self.state["phase"] if self.state else None


def _make_attempt_dir(folder: Path) -> None:
    """Make an attempt's folder: a rank run as its submitter reaches its control file there, and
    reads nothing (0711)."""
    try:
        os.mkdir(folder, 0o711)
    except FileExistsError:
        pass
    except FileNotFoundError:  # no run folder yet
        folder.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o711)
    os.chmod(folder, 0o711)


#: (pid, start time) -> (when looked at, alive): the gangs of one stepd host share its pid, and
#: each gang's watcher asks every `_LIVENESS_EVERY`; one look at /proc answers them all for a while.
_LOOKS: dict[tuple[int | None, str | None], tuple[float, bool]] = {}
_LOOK_FOR = _LIVENESS_EVERY / 2


def _alive(pid: int | None, started: str | None) -> bool:
    """`is_alive`, looked at once per `_LOOK_FOR` seconds for every gang of the same stepd."""
    now = time.monotonic()
    key = (pid, started)
    seen = _LOOKS.get(key)
    if seen is not None and now - seen[0] < _LOOK_FOR:
        return seen[1]
    if len(_LOOKS) > 1024:
        _LOOKS.clear()
    alive = _LOOKS[key] = (now, is_alive(pid, started))
    return alive[1]


def _completed(folder: Path) -> bool:
    """Whether the attempt in `folder` completed here (every rank of it exited 0)."""
    state = read_state(folder)
    return state is not None and state.get("end") == GangEnd.COMPLETED.value


class Supervisor:
    """Every gang attempt this node runs, through its stepd, keyed by job id (one attempt at a time).

    `run_dir` holds one folder per attempt. `kill_grace` is the stepd's SIGTERM -> SIGKILL delay
    for the peers of a crashed rank. `base_env` is the environment the stepd (and so each rank)
    starts from; `python` the interpreter that runs the stepd. `launcher` starts the stepds (a
    fork server, see `zygote`; shared by the agents of one process); without one, the supervisor
    starts its own, ended by `close` and `detach`. `stepd_host`: a gang of the plain `process`
    runtime runs in the fork server itself (`stepd_host`) rather than under a stepd of its own.
    """

    def __init__(self, events: AgentEvents, run_dir: Path, *, kill_grace: float = 5.0,
                 poll_interval: float = 0.05, base_env: Mapping[str, str] | None = None,
                 python: str = sys.executable, launcher: ForkServer | None = None, stepd_host: bool = True) -> None:
        self._events = events
        self._run_dir = run_dir
        self._kill_grace = kill_grace
        self._poll_interval = poll_interval
        self._base_env = dict(environment.mapping() if base_env is None else base_env)
        self._python = python
        self._own_launcher = launcher is None
        self._launcher = launcher or ForkServer(python, self._base_env, host=stepd_host)
        self._gangs: dict[str, _Gang] = {}
        self._others: set[_Gang] = set()  # older attempts still ending (adopted next to a newer one)
        self._ended: OrderedDict[str, GangOutcome] = OrderedDict()  # newest outcome per job, bounded
        self._ending: set[_Gang] = set()  # gangs whose reports are being published (`_finish`)
        self.folders = RunFolders(run_dir)  # the attempts launched here, by their folders

    @staticmethod
    async def _emit(call: Awaitable[None]) -> None:
        """Await one `AgentEvents` call. A failing callback is a bug in the adapter; it is logged
        and must not stop the supervisor from following (and eventually finishing) the gang."""
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
        if gang is None or gang.state is None:
            return {}
        return {int(r): rec["pid"] for r, rec in gang.state["ranks"].items()
                if rec.get("pid") and rec.get("exited_at") is None}

    def stepd_pid(self, job_id: str) -> int | None:
        gang = self._gangs.get(job_id)
        return gang.stepd_pid if gang else None

    async def launched(self, job_id: str) -> int | None:
        """Wait until the stepd of `job_id`'s running attempt is started; its pid (None: no attempt
        runs here, or its stepd could not start)."""
        gang = self._gangs.get(job_id)
        if gang is None:
            return None
        await gang.launched.wait()
        return gang.stepd_pid

    def last_outcome(self, job_id: str) -> GangOutcome | None:
        """How the newest ended attempt of `job_id` ended here (recent jobs only)."""
        return self._ended.get(job_id)

    async def wait(self, job_id: str) -> GangOutcome | None:
        """Wait for the current attempt of `job_id` to end; if none runs, its last outcome (or None)."""
        gang = self._gangs.get(job_id)
        if gang is None:
            return self._ended.get(job_id)
        return await asyncio.shield(gang.ended)

    # --- start ---------------------------------------------------------------------------------

    def attempts_over(self, job_id: str, up_to_attempt: int | None) -> None:
        """The log holds the end of `job_id`'s attempts up to `up_to_attempt` (None: every one;
        the job ended): their folders go, each once it is reported (at once, or in `_finish`).
        A folder not reported stays: its stepd may still write, and its reports are not all
        published (an agent started next adopts and reports it)."""
        followed = {gang.folder: gang for gang in (self._gangs.get(job_id), *self._others, *self._ending)
                    if gang is not None and gang.assignment.job_id == job_id
                    and (up_to_attempt is None or gang.assignment.attempt <= up_to_attempt)}
        for gang in followed.values():
            gang.over = True
        for number, folder in self.folders.folders(job_id, up_to_attempt):
            if folder not in followed and is_reported(folder):
                self.folders.remove(job_id, number, folder)

    async def start(self, assignment: Assignment, *, cause: str | None = None, wait: bool = True) -> GangStart:
        """Launch the stepd of `assignment` and wait until it has spawned every local rank.

        `wait=False` returns once launch.json is written (an empty GangStart); the stepd is asked
        for by the gang's watcher (`launched` waits for that): the agent's events consumer does
        not wait for a job's stepd or ranks before it starts the next job's; what they did is
        reported from the stepd's state as always, and a command sent meanwhile is in
        commands.json, read by the stepd as it starts.

        Idempotent for the same (job, attempt): a redelivered reservation returns the running one,
        and one for an attempt launched here before (even by an earlier agent process) is not
        relaunched (`already_ended`). A rank that cannot be spawned makes the stepd stop the
        others (their peers would block forever in their first collective).
        """
        job = assignment.job_id
        existing = self._gangs.get(job)
        if existing is not None:
            if existing.assignment.attempt != assignment.attempt:
                raise RuntimeError(f"job {job}: attempt {existing.assignment.attempt} still "
                                   f"runs here; stop it before starting attempt {assignment.attempt}")
            return GangStart(job, assignment.attempt, self._started_pids(existing), {}, already_running=True)
        if self.folders.launched_here(job, assignment.attempt):
            return GangStart(job, assignment.attempt, {}, {}, already_ended=True)
        folder = attempt_dir(self._run_dir, job, assignment.attempt)
        _make_attempt_dir(folder)
        self.folders.added(job, assignment.attempt, folder)
        launch = Launch(assignment=assignment, cause=cause, kill_grace=self._kill_grace, launched_at=time.time())
        write_new_json(folder / LAUNCH, launch.to_json())
        gang = _Gang(folder=folder, launch=launch)
        self._gangs[job] = gang
        gang.task = asyncio.create_task(self._watch(gang, launch=True), name=f"stepd-{job}")
        if not wait:
            return GangStart(job, assignment.attempt, {}, {})
        while not (gang.ended.done() or (gang.phase is not None and gang.phase != STARTING)):
            gang.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(gang.changed.wait(), 1.0)
        if gang.phase in (ENDED, ABANDONED):
            await asyncio.shield(gang.ended)  # nothing started: the gang is over before we return
        state = gang.state or {"ranks": {}}
        failed = {int(r): rec.get("message") or "" for r, rec in state["ranks"].items()
                  if rec.get("reason") == ExitReason.START_FAILED}
        return GangStart(job, assignment.attempt, self._started_pids(gang), failed)

    @staticmethod
    def _started_pids(gang: _Gang) -> dict[int, int]:
        state = gang.state or {"ranks": {}}
        return {int(r): rec["pid"] for r, rec in state["ranks"].items() if rec.get("pid")}

    def _write_start_failed(self, gang: _Gang, message: str) -> None:
        """The stepd never ran: claim its folder and record every rank as not started."""
        a = gang.assignment
        now = time.time()
        ranks = {str(r.rank): {"pid": None, "exit_code": None, "started_at": None, "exited_at": now,
                               "reason": ExitReason.START_FAILED.value, "message": message, "cause": gang.launch.cause}
                 for r in a.ranks}
        state = {"version": STATE_VERSION, "job_id": a.job_id, "attempt": a.attempt, "phase": ENDED,
                 "mode": "failing", "end": GangEnd.FAILED.value, "ranks": ranks, "checkpoints": [],
                 "failed_rank": a.ranks[0].rank, "failed_exit_code": None, "commands_done": 0}
        try:
            created = create_json(gang.folder / STATE, state)
        except OSError as exc:  # a full disk: the reports go out from memory all the same
            log.warning("%s: cannot write its state (%s); reporting from memory", gang.folder, exc)
            created = True
        if not created:
            log.warning("%s: the stepd wrote its state after all", gang.folder)
            return
        gang.state = state
        gang.changed.set()

    # --- following a stepd ---------------------------------------------------------------------

    def _stepd_alive(self, gang: _Gang) -> bool:
        if gang.proc is not None:
            return gang.proc.poll() is None  # also reaps it
        return _alive(gang.stepd_pid, gang.stepd_started)

    def _refresh(self, gang: _Gang) -> bool:
        """Read state.json if it changed; True if it did."""
        version = file_version(gang.state_file)
        if version == gang.version:
            return False
        state = read_state_file(gang.state_file)
        if state is None:
            return False
        gang.version = version
        gang.state = state
        if gang.stepd_pid is None or gang.proc is None:
            gang.stepd_pid = state.get("stepd_pid")
        gang.stepd_started = state.get("stepd_started") or gang.stepd_started
        gang.shared = gang.shared or bool(state.get("stepd_shared"))
        gang.changed.set()
        return True

    async def _launch(self, gang: _Gang) -> None:
        """Have the launcher start the gang's stepd (whose launch.json is written)."""
        try:
            gang.stepd_pid, gang.stepd_started, gang.proc, gang.shared = await self._launcher.spawn(
                gang.folder, gang.assignment.runtime)
        except OSError as exc:
            self._write_start_failed(gang, f"the stepd could not start: {type(exc).__name__}: {exc}")
        finally:
            gang.launched.set()

    async def _watch(self, gang: _Gang, *, launch: bool = False) -> None:
        try:
            if launch:
                await self._launch(gang)
            else:
                gang.launched.set()
            await self._follow(gang)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug: say so loudly, keep the agent running
            log.exception("%s: following its stepd failed", gang.folder)
            if not gang.ended.done():
                gang.ended.set_result(self._outcome(gang))

    async def _follow(self, gang: _Gang) -> None:
        loop = asyncio.get_running_loop()
        checked = loop.time()
        if gang.state is not None:  # read at adoption
            await self._report(gang)
        while True:
            if gang.pending and loop.time() - checked >= _LIVENESS_EVERY:
                self._flush_commands(gang)
            if self._refresh(gang):
                await self._report(gang)
            if gang.phase in (ENDED, ABANDONED):
                break
            if loop.time() - checked >= _LIVENESS_EVERY:
                checked = loop.time()
                if not self._stepd_alive(gang):
                    if self._refresh(gang):
                        await self._report(gang)
                    if gang.phase not in (ENDED, ABANDONED):
                        self._stepd_died(gang)
                        if gang.state is not None:
                            await self._report(gang)
                    continue
            # until state.json changes, or the next liveness check (one timer for every gang)
            await StatePoller.shared(self._poll_interval).wait(
                gang.state_file, gang.version, checked + _LIVENESS_EVERY - loop.time())
        if gang.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(gang.proc.wait, 10)
        await self._finish(gang)

    def _stepd_died(self, gang: _Gang) -> None:
        """The stepd is gone without writing an end: kill what is left of its ranks and record their
        exits on its behalf (no exit code is known), so the gang is reported and ends."""
        state = gang.state
        if state is None:
            tail = ""
            with contextlib.suppress(OSError):
                tail = (gang.folder / STEPD_LOG).read_text(errors="replace")[-500:].strip()
            self._write_start_failed(gang, "the stepd exited before starting the ranks" + (f": {tail}" if tail else ""))
            return
        log.error("%s attempt %d: its stepd (pid %s) died; killing what is left of its ranks",
                  gang.assignment.job_id, gang.assignment.attempt, gang.stepd_pid)
        now = time.time()
        for r, rec in state["ranks"].items():
            if rec.get("exited_at") is not None:
                continue
            if is_alive(rec.get("pid"), rec.get("pid_started")):
                signal_group(rec["pid"], signal_module.SIGKILL)
            rec.update(exited_at=now, exit_code=None, reason=ExitReason.CRASHED.value,
                       message=f"its stepd (pid {gang.stepd_pid}) died; the rank was killed")
            if state.get("failed_rank") is None:
                state["failed_rank"] = int(r)
        state.update(phase=ENDED, mode="failing", end=GangEnd.FAILED.value)
        try:
            write_json(gang.folder / STATE, state)
        except OSError as exc:  # a full disk: the reports go out from memory all the same
            log.warning("%s: cannot write its state (%s); reporting from memory", gang.folder, exc)

    async def _report(self, gang: _Gang) -> None:
        """Call the callbacks for what `gang.state` holds that this process has not reported yet."""
        state = gang.state
        assert state is not None
        a = gang.assignment
        ranks = sorted(state["ranks"].items(), key=lambda kv: int(kv[0]))
        for r, rec in ranks:
            if rec.get("pid") and rec.get("started_at") is not None and ("started", r) not in gang.emitted:
                gang.emitted.add(("started", r))
                await self._emit(self._events.worker_started(a.job_id, int(r), int(rec["pid"]), a.attempt,
                                                             at=float(rec["started_at"]), cause=gang.launch.cause))
        for i, c in enumerate(state.get("checkpoints", [])):
            if ("checkpoint", i) in gang.emitted:
                continue
            gang.emitted.add(("checkpoint", i))
            await self._emit(self._events.checkpoint_done(a.job_id, Path(c["path"]), int(c["step"]), int(c["rank"]),
                                                          a.attempt, at=float(c["at"]), cause=c.get("cause")))
        # in the order they happened: the first crash must reach placement first (it names the cause)
        for r, rec in sorted(ranks, key=lambda kv: (kv[1].get("exited_at") or 0.0, int(kv[0]))):
            if rec.get("exited_at") is None or ("exited", r) in gang.emitted:
                continue
            gang.emitted.add(("exited", r))
            await self._emit(self._events.worker_exited(
                a.job_id, int(r), rec.get("exit_code"), a.attempt, ExitReason(rec["reason"]),
                at=float(rec["exited_at"]), cause=rec.get("cause"), message=rec.get("message") or ""))

    async def _finish(self, gang: _Gang) -> None:
        a = gang.assignment
        if self._gangs.get(a.job_id) is gang:
            del self._gangs[a.job_id]
        self._others.discard(gang)
        outcome = self._outcome(gang)
        if not gang.ended.done():
            gang.ended.set_result(outcome)
        self._ended.pop(a.job_id, None)
        self._ended[a.job_id] = outcome
        while len(self._ended) > _ENDED_KEPT:
            self._ended.popitem(last=False)
        StatePoller.shared(self._poll_interval).forget(gang.state_file)
        self._ending.add(gang)
        try:
            await self._emit(self._events.gang_ended(outcome))  # returns once its reports are published
        finally:
            self._ending.discard(gang)
        try:
            mark_reported(gang.folder)
        except OSError:
            return
        if gang.over or outcome.end is GangEnd.COMPLETED:
            self.folders.remove(a.job_id, a.attempt, gang.folder)

    @staticmethod
    def _outcome(gang: _Gang) -> GangOutcome:
        a = gang.assignment
        state = gang.state or {"ranks": {}, "checkpoints": []}
        exits = {int(r): int(rec["exit_code"]) for r, rec in state["ranks"].items()
                 if rec.get("exit_code") is not None}
        newest: dict[int, CheckpointReport] = {}
        for c in state.get("checkpoints", []):
            newest[int(c["rank"])] = CheckpointReport(rank=int(c["rank"]), attempt=a.attempt, path=Path(c["path"]),
                                                      step=int(c["step"]))
        report = newest[min(newest)] if newest else None
        try:
            end = GangEnd(state.get("end") or GangEnd.STOPPED)
        except ValueError:
            end = GangEnd.FAILED
        return GangOutcome(job_id=a.job_id, attempt=a.attempt, end=end, exits=exits, checkpoint=report,
                           resume_from=report.path if report else a.resume_from,
                           failed_rank=state.get("failed_rank"), failed_exit_code=state.get("failed_exit_code"))

    # --- commands ------------------------------------------------------------------------------

    def _command(self, gang: _Gang, command: dict[str, Any]) -> None:
        """Append `command` to the gang's commands.json (atomically) and wake its stepd.

        A disk that refuses the write (full) keeps the command in memory, written at the watcher's
        next tries (`_flush_commands`); a stop does not wait for it: SIGTERM to the stepd is a stop
        (not to a shared one: it would stop every gang it holds)."""
        gang.pending.append(command)
        if not self._flush_commands(gang) and command.get("op") == "stop" and not gang.shared:
            self._signal_stepd(gang, signal_module.SIGTERM)

    def _flush_commands(self, gang: _Gang) -> bool:
        """Write the commands kept in memory; True once none is left."""
        if not gang.pending:
            return True
        try:
            write_json(gang.folder / COMMANDS, [*read_commands(gang.folder), *gang.pending])
        except OSError as exc:
            log.warning("%s: cannot write its commands (%s); trying again", gang.folder, exc)
            return False
        gang.pending.clear()
        self._signal_stepd(gang, WAKE_SIGNAL)
        return True

    def _signal_stepd(self, gang: _Gang, sig: int) -> None:
        if gang.proc is not None:
            if gang.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    gang.proc.send_signal(sig)
        elif gang.stepd_pid and is_alive(gang.stepd_pid, gang.stepd_started):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(gang.stepd_pid, sig)

    def send_preempt(self, job_id: str, grace_seconds: float, signal: str | None = None, *,
                     cause: str | None = None) -> bool:
        """Tell the stepd to preempt the gang (see `preempt`) without waiting; False if nothing runs."""
        gang = self._gangs.get(job_id)
        if gang is None:
            return False
        self._command(gang, {"op": "preempt", "signal": signal, "grace": grace_seconds,
                             "deadline": time.time() + grace_seconds, "cause": cause})
        return True

    def send_stop(self, job_id: str, grace_seconds: float, *, cause: str | None = None) -> bool:
        """Tell the stepd to stop the gang (SIGTERM, SIGKILL after the grace); False if nothing runs."""
        gang = self._gangs.get(job_id)
        if gang is None:
            return False
        self._command(gang, {"op": "stop", "grace": grace_seconds, "cause": cause})
        return True

    async def preempt(self, job_id: str, grace_seconds: float, signal: str | None = None, *,
                      cause: str | None = None) -> GangOutcome | None:
        """Ask the job's ranks to checkpoint and stop, and wait for the gang to end.

        The stepd: 1. sends `signal` (default: the job's checkpoint signal) to every rank's group;
        2. waits until each rank reported a checkpoint or exited, then up to 2 s for reporting
        ranks to exit by themselves; 3. SIGTERMs the survivors then, or at the latest
        `min(5s, 20% of grace)` before the deadline; 4. SIGKILLs whatever is left at the deadline.

        Returns the outcome: PREEMPTED, or whatever ended it first; for a job that no longer runs
        here, its last outcome, or None if it never ran here.
        """
        gang = self._gangs.get(job_id)
        if gang is None:
            return self._ended.get(job_id)
        self.send_preempt(job_id, grace_seconds, signal, cause=cause)
        return await asyncio.shield(gang.ended)

    async def stop(self, job_id: str, grace_seconds: float, *, cause: str | None = None) -> GangOutcome | None:
        """SIGTERM the job's ranks, SIGKILL them after `grace_seconds`, and wait for the end."""
        gang = self._gangs.get(job_id)
        if gang is None:
            return None
        self.send_stop(job_id, grace_seconds, cause=cause)
        return await asyncio.shield(gang.ended)

    async def close(self, grace_seconds: float = 2.0) -> None:
        """Stop every gang and wait for their ends (an agent told to stop its workers on exit)."""
        others = list(self._others)
        for gang in others:
            self._command(gang, {"op": "stop", "grace": grace_seconds, "cause": None})
        await asyncio.gather(*(self.stop(job_id, grace_seconds) for job_id in list(self._gangs)),
                             *(asyncio.shield(g.ended) for g in others))
        if self._own_launcher:
            await self._launcher.close()

    async def detach(self) -> None:
        """Stop following the stepds and leave them running (a graceful agent stop: an upgrade).
        The next agent process adopts them (`adopt`). A stepd being asked for is waited for (a
        few seconds at most): its gang is then adopted as any other, not abandoned."""
        asking = [g.launched.wait() for g in self._gangs.values() if not g.launched.is_set()]
        if asking:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*asking), _LAUNCH_WAIT)
        tasks = [g.task for g in [*self._gangs.values(), *self._others, *self._ending] if g.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._gangs.clear()
        self._others.clear()
        if self._own_launcher:
            await self._launcher.close()

    # --- adoption ------------------------------------------------------------------------------

    async def adopt(self, over: Callable[[str, int], bool] | None = None, *,
                    redeliverable: Callable[[str, int], bool] | None = None) -> list[AdoptedGang]:
        """Follow the gang attempts an earlier agent process left in `run_dir` (call once, at start).

        Returns each attempt found that still has something to report: `running` ones have a live
        stepd; the others ended while no agent was there (their reports go out now) or lost their
        stepd (their ranks are killed and reported as CRASHED). `over(job, attempt)`: whether the
        log holds that attempt's end; such a folder goes once reported (at once if it is).
        `redeliverable(job, attempt)`: whether its reservation may still be delivered (None: any
        may); the removed attempts of the others are forgotten (`RunFolders.seed`).
        """
        found: list[_Gang] = []
        listed = sorted(attempt_folders(self._run_dir))
        self.folders.seed(listed, redeliverable)
        for job, number, folder in listed:
            gang = self._adoptable(folder)
            if gang is not None:
                gang.over = over is not None and over(job, number)
                found.append(gang)
            elif is_reported(folder) and ((over is not None and over(job, number)) or _completed(folder)):
                self.folders.remove(job, number, folder)
        adopted: list[AdoptedGang] = []
        for gang in sorted(found, key=lambda g: (g.assignment.job_id, g.assignment.attempt)):
            job = gang.assignment.job_id
            older = self._gangs.get(job)
            if older is not None:  # two attempts of one job here: only the newest may run
                self._others.add(older)
                self._command(older, {"op": "stop", "grace": self._kill_grace, "cause": None})
            self._gangs[job] = gang
            running = gang.phase not in (ENDED, ABANDONED) and self._stepd_alive(gang)
            adopted.append(AdoptedGang(job, gang.assignment.attempt, gang.launch.launched_at, running))
            log.info("adopted %s attempt %d (stepd pid %s, %s)", job, gang.assignment.attempt, gang.stepd_pid,
                     "running" if running else gang.phase)
            gang.task = asyncio.create_task(self._watch(gang), name=f"stepd-{job}")
        return adopted

    def _adoptable(self, folder: Path) -> _Gang | None:
        if is_reported(folder):
            return None
        launch = read_launch(folder)
        if launch is None:
            return None
        a = launch.assignment
        if read_state(folder) is None and abandon(folder, a.job_id, a.attempt,
                                                  "the agent restarted before the stepd wrote its state"):
            log.warning("%s: launched but never started (the agent stopped first); abandoned", folder)
            mark_reported(folder)
            return None
        state = read_state(folder)
        if state is None or state.get("phase") == ABANDONED:
            with contextlib.suppress(OSError):
                mark_reported(folder)
            return None
        gang = _Gang(folder=folder, launch=launch, stepd_pid=state.get("stepd_pid"),
                     stepd_started=state.get("stepd_started"))
        self._refresh(gang)
        return gang

