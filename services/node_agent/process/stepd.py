"""`python -m corral.services.node_agent.process.stepd <attempt-dir>`: one gang attempt's ranks on one node.

Why: ranks that are children of the node-agent process would be orphans whose exits nobody sees
after a `kill -9` of the agent, and a graceful stop of the agent (an upgrade, Ctrl-C of `corral
up`) would kill every one of them. Slurm solves this with slurmstepd, a small
per-step supervisor that outlives slurmd; this is Corral's.

The agent writes `launch.json` (see `step_files`) and starts this process in its own session; it
then owns the ranks: it launches them through the job's runtime (`runtimes`: a process, a
bubblewrap sandbox or a container; each in its own process group, env and log exactly as
before), waits for them, writes every start, checkpoint report and exit (code or signal, and
why) to `state.json` (a record appended per change, see `step_files`), carries out the agent's
commands from `commands.json` (preempt: the checkpoint signal, SIGTERM, SIGKILL at the deadline;
stop: SIGTERM, SIGKILL after the grace) and tears the local gang down when one rank crashes. It
exits once every rank has ended and the final state is written. It never talks to NATS: whichever
agent runs reports from the state file.

When the Assignment names a `user` (an agent run as root with `--run-as submitter`, see `run_as`),
the stepd stays root, so that it can signal and kill the ranks, and starts each rank with that
user's uid, gid and groups; it gives the user its checkpoint directory, its control file and its
log file (not their folders), and refuses to start it (START_FAILED, naming the directory) when
the user could not reach them.

Why signals + a command file rather than a socket: the state must be on disk anyway for the next
agent; a unix socket path would have to fit in 108 bytes (run dirs are deep) and a socket adds a
connection lifecycle to both sides. A command is a line in a file the agent rewrites atomically,
and SIGUSR2 only says "look now" (the stepd also looks at every wake-up, so a lost signal costs
one poll period). SIGTERM to the stepd itself stops the gang (SIGTERM, SIGKILL after kill_grace).

Each rank writes its stdout and stderr into a pipe the stepd copies to the rank's log
(`rank_output`): a log folder that fills drops output (said by a marker line once it takes writes
again) and never fails the rank.

It is a plain loop on `select` (a wake-up pipe fed by SIGCHLD, SIGUSR2 and SIGTERM) and imports only
the standard library and the agent's stdlib-only modules: one of these runs per gang per node.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal as signal_module
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from corral import environment
from corral.contracts.worker import CHECKPOINTED_EXIT_CODE, signal_from_name

from .assignment import build_rank_env, rank_log_path
from .control import ControlChannel
from .rank_output import RankOutput
from .run_as import WorkerUser, make_dir_as, own_dir, own_file, reach_problem, user_base_env
from .runtimes import GPU_DEVICES_ENV, USER_FLAG_RUNTIMES, Launch, runtime_for
from .step_files import (
    COMMANDS,
    ENDED,
    RUNNING,
    STARTING,
    STATE,
    STATE_VERSION,
    WAKE_SIGNAL,
    append_state,
    claim_state,
    control_path,
    process_start_time,
    read_commands_file,
    read_launch,
    signal_group,
    signal_group_members,
)
from .step_files import Launch as LaunchFile

log = logging.getLogger("corral.stepd")

POLL_RUNNING = 0.25  # control files while nothing is pending; exits and commands wake us at once
POLL_BUSY = 0.05  # while preempting (waiting for checkpoint reports)
LINGER_RETRY = 1.0  # seconds between tries to remove a container its client left behind
EXIT_AFTER_REPORT = 2.0  # a gang all here whose ranks reported their checkpoint gets this long to exit
SAVE_RETRY = 0.5  # seconds between tries to write a state the disk refused (full)

# state["mode"]: what the gang is doing; decides the reason of an exit (see `classify`)
M_RUNNING, M_PREEMPTING, M_STOPPING, M_FAILING = "running", "preempting", "stopping", "failing"


def classify(mode: str, code: int) -> str:
    """The ExitReason value of a rank exit (see `supervisor.ExitReason`)."""
    if code == 0:
        return "completed"
    if code == CHECKPOINTED_EXIT_CODE:
        return "checkpointed"
    if mode == M_PREEMPTING:
        return "preempted"
    if mode == M_STOPPING:
        return "stopped"
    if mode == M_FAILING:
        return "gang_killed"  # the peers of a crashed rank die of it one way or another
    return "crashed"


def gang_end(state: dict[str, Any]) -> str:
    """The GangEnd value of a finished attempt."""
    codes = [r.get("exit_code") for r in state["ranks"].values()]
    if state["mode"] == M_FAILING:
        return "failed"
    if codes and all(c == 0 for c in codes):
        return "completed"
    if state["mode"] == M_PREEMPTING:
        return "preempted"
    if state["mode"] == M_STOPPING:
        return "stopped"
    return "checkpointed"


def open_log_fd(path: Path, user: WorkerUser | None) -> int:
    """A rank's log, for appending, never through a symlink. Run as its submitter, the rank's user
    owns the file (to read it back) but not its directory: the stepd, root, writes there too."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        if user is not None:
            os.fchown(fd, user.uid, user.gid)
            os.fchmod(fd, 0o640)
    except OSError:
        os.close(fd)
        raise
    return fd


def command_grace(command: dict[str, Any]) -> float:
    """The seconds a preempt command gives the gang from when it is read: its `grace` (the agent
    names it, and it holds whatever the clocks do), else (an agent of an older version) its
    `deadline` less this node's wall clock."""
    if "grace" in command:
        return float(command["grace"])
    return float(command["deadline"]) - time.time()


class Stepd:
    """One gang attempt's ranks. `base_env`: the environment the ranks start from (default: this
    process's); `stepd_started`: this process's start time, when the caller knows it."""

    def __init__(self, folder: Path, launch: LaunchFile, *, base_env: Mapping[str, str] | None = None,
                 stepd_started: str | None = None) -> None:
        self.folder = folder
        self.base_env = base_env
        self.commands_file = os.path.join(folder, COMMANDS)
        self.launch = launch
        self.a = launch.assignment
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        #: ranks whose process ended but whose container is still there: rank -> (exit code, next try)
        self.lingering: dict[int, tuple[int, float]] = {}
        self.controls: dict[int, ControlChannel] = {}
        self.launches: dict[int, Launch] = {}  # how each rank was started (its runtime's Launch)
        self.outputs: dict[int, RankOutput] = {}  # each rank's log, fed from its stdout pipe
        self.reported: set[int] = set()  # ranks that reported a checkpoint during a preemption
        self.kill_at: float | None = None
        self.preempting: dict[str, Any] | None = None
        self.term_requested = False
        self.dirty = False
        self.unsaved = False  # the last write of the state failed: it is only in memory
        self.state: dict[str, Any] = {
            "version": STATE_VERSION, "job_id": self.a.job_id, "attempt": self.a.attempt, "phase": STARTING,
            "mode": M_RUNNING, "stepd_pid": os.getpid(),
            "stepd_started": stepd_started or process_start_time(os.getpid()),
            "cause": launch.cause, "ranks": {}, "checkpoints": [], "commands_done": 0,
            "failed_rank": None, "failed_exit_code": None, "end": None, "updated_at": time.time(),
        }

    # --- the loop ----------------------------------------------------------------------------------

    def run(self, term_requested: Callable[[], bool] = lambda: False) -> int:
        """Run the gang to its end. `term_requested`: whether a SIGTERM came before this stepd set
        its own handler (a forked stepd, see `zygote`); it is a stop like any later one."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal_module.set_wakeup_fd(wake_w)
        for sig in (signal_module.SIGCHLD, WAKE_SIGNAL):
            signal_module.signal(sig, _nothing)
        signal_module.signal(signal_module.SIGTERM, self._on_term)
        if term_requested():
            self.term_requested = True
        # No SIG_IGN here: the ranks would inherit it. In its own session, no terminal signals it.
        default_inherited_ignores()
        code = self.begin()
        if code is not None:
            return code
        while self.tick(time.monotonic()):
            now = time.monotonic()
            self.wait(wake_r, now + self.timeout(now))
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 512):
                    pass
        return 0

    def begin(self) -> int | None:
        """Claim the attempt's state and start the ranks: None once they run, else the exit code
        of a stepd that starts nothing (its state cannot be written, or the agent abandoned it)."""
        try:
            created = claim_state(self.folder, self.state)
        except OSError as exc:  # nothing started yet: the agent reports the ranks as not started
            log.error("%s: cannot write its state (%s); not starting the ranks", self.folder, exc)
            return 1
        if not created:
            log.warning("%s: the agent abandoned this attempt before we started; not running it", self.folder)
            return 0
        self.spawn_all()
        self.state["phase"] = RUNNING
        self.save()
        return None

    def tick(self, now: float) -> bool:
        """One pass: commands, checkpoint reports, exits, escalation, the state written. False once
        every rank has ended and the end is written (or can never be: its folder is gone)."""
        if self.state["phase"] != ENDED:
            self.read_commands(now)
            self.drain_controls()
            self.reap(now)
            self.escalate(now)
            if self.live():
                if self.dirty:
                    self.save()
                return True
            self.state["phase"] = ENDED
            self.state["end"] = gang_end(self.state)
            log.debug("%s attempt %d ended: %s", self.a.job_id, self.a.attempt, self.state["end"])
        if self.save():
            return False
        if not self.folder.is_dir():
            log.warning("%s is gone; the attempt's end cannot be written down", self.folder)
            return False
        return True  # the disk refused it: tried again at SAVE_RETRY (see `timeout`)

    def pipes(self) -> dict[int, RankOutput]:
        """The ranks' output pipes still open, by fd."""
        return {out.pipe: out for out in self.outputs.values() if out.pipe is not None}

    def wait(self, wake_r: int, until: float) -> None:
        """Copy the ranks' output to their logs until a signal wakes us or `until` (monotonic):
        output alone does not run the loop's checks (a chatty rank would make them spin)."""
        while True:
            pipes = self.pipes()
            try:
                ready = select.select([wake_r, *pipes], [], [], max(0.0, until - time.monotonic()))[0]
            except InterruptedError:
                return
            for fd in ready:
                if fd in pipes:
                    pipes[fd].pump(until_empty=False)
            if wake_r in ready or time.monotonic() >= until:
                return

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        self.term_requested = True

    def live(self) -> list[int]:
        return [int(r) for r, rec in self.state["ranks"].items() if rec.get("exited_at") is None]

    def save(self) -> bool:
        """Write the state down; False when the disk refused it (full, read-only, an I/O error).

        A failed write never ends the stepd: the state stays in memory, `dirty`, and is written
        at the next try (`SAVE_RETRY`); what the ranks did is kept, never lost to the disk."""
        self.state["updated_at"] = time.time()
        try:
            append_state(self.folder / STATE, self.state)
        except OSError as exc:
            self.dirty = True
            if not self.unsaved:
                log.warning("cannot write %s (%s); keeping the state in memory and trying again every %.1fs",
                            self.folder / STATE, exc, SAVE_RETRY)
            self.unsaved = True
            return False
        if self.unsaved:
            log.info("%s written again", self.folder / STATE)
        self.unsaved = False
        self.dirty = False
        return True

    def save_final(self) -> bool:
        """Write the ended state, trying until the disk takes it: the ranks are gone, and their
        exits leave only once written down. A run folder that no longer exists (the node's state
        removed) will never take it and no agent can adopt it: False, and the stepd ends."""
        while not self.save():
            if not self.folder.is_dir():
                log.warning("%s is gone; the attempt's end cannot be written down", self.folder)
                return False
            time.sleep(SAVE_RETRY)
        return True

    def timeout(self, now: float) -> float:
        if self.state["phase"] == ENDED:
            return SAVE_RETRY  # only its end is left to write
        due = [POLL_BUSY if self.preempting else POLL_RUNNING]
        if self.unsaved:
            due.append(SAVE_RETRY)
        due += [at - now for _, at in self.lingering.values()]
        if self.kill_at is not None:
            due.append(self.kill_at - now)
        p = self.preempting
        if p is not None:  # only what is still to come: a time gone by would make the loop spin
            due += ([] if p["termed"] else [p["term_at"] - now]) + ([] if p["killed"] else [p["deadline"] - now])
        return max(0.0, min(due))

    # --- ranks ---------------------------------------------------------------------------------

    def spawn_all(self) -> None:
        failed: int | None = None
        for spec in self.a.ranks:
            rec: dict[str, Any] = {"pid": None, "pid_started": None, "started_at": None, "exit_code": None,
                                   "exited_at": None, "reason": None, "message": None, "cause": self.launch.cause}
            self.state["ranks"][str(spec.rank)] = rec
            if failed is not None:
                rec.update(exited_at=time.time(), reason="gang_killed",
                           message=f"not started: rank {failed} on this node could not start")
                continue
            try:
                self.procs[spec.rank] = self.spawn(spec.rank)
            except OSError as exc:
                failed = spec.rank
                rec.update(exited_at=time.time(), reason="start_failed", message=f"{type(exc).__name__}: {exc}")
                continue
            proc = self.procs[spec.rank]
            rec.update(pid=proc.pid, pid_started=process_start_time(proc.pid), started_at=time.time())
            self.controls[spec.rank] = ControlChannel(control_path(self.folder, spec.rank))
        if failed is not None:
            self.state.update(mode=M_FAILING, failed_rank=failed)
            self.terminate(self.launch.kill_grace, time.monotonic())

    def spawn(self, rank: int) -> subprocess.Popen[bytes]:
        spec = next(r for r in self.a.ranks if r.rank == rank)
        user = self.a.user
        log_path = rank_log_path(self.a, spec)
        with contextlib.suppress(OSError):  # a full disk: the output is dropped, the rank runs
            log_path.parent.mkdir(parents=True, exist_ok=True)
        out = self.outputs[rank] = RankOutput(lambda: open_log_fd(log_path, user))
        out.open()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        who = f" as {user.name} (uid {user.uid})" if user else ""
        out.write(f"==== corral job {self.a.job_id} attempt {self.a.attempt} rank {spec.rank} "
                  f"node_rank {self.a.node_rank} started {stamp}{who} ====\n".encode())
        read_end, write_end = os.pipe()
        try:
            control = control_path(self.folder, spec.rank)
            env = environment.mapping() if self.base_env is None else self.base_env
            base = env if user is None else user_base_env(env, user)
            if user is not None:
                # As the submitter (see `run_as`): the stepd stays root to signal the ranks; the
                # rank gets its own checkpoint directory and control file, nothing else of ours.
                if self.a.checkpoint_dir_from_spec:
                    make_dir_as(self.a.checkpoint_dir, user)
                else:
                    own_dir(self.a.checkpoint_dir, user)
                own_file(control, user)
                workdir = self.a.workdir  # checked on the host only where it is a host folder
                seen = workdir if self.a.runtime == "process" and workdir and workdir.is_dir() else None
                problem = reach_problem([self.a.checkpoint_dir, control], user, seen)
                if problem is not None:
                    raise PermissionError(problem)
            elif self.a.runtime != "process":  # a bind's source must exist
                self.a.checkpoint_dir.mkdir(parents=True, exist_ok=True)
                os.close(os.open(control, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
            runtime = runtime_for(self.a.runtime, environment.get(GPU_DEVICES_ENV))
            launch = runtime.launch(self.a, spec, build_rank_env(self.a, spec, control, base), control)
            missing = [str(p) for p in launch.needs if not p.exists()]
            if missing:
                raise FileNotFoundError(f"mount source {', '.join(missing)} does not exist on this node")
            self.launches[spec.rank] = launch
            cwd = launch.cwd if launch.cwd or user is None or self.a.runtime != "process" else user.cwd()
            if cwd is not None and self.a.runtime == "process" and not os.path.isdir(cwd):
                # As slurmstepd does: a folder this node does not have (the submitter's, on a
                # laptop) is no reason not to run; say so where the user looks.
                fallback = user.cwd() if user is not None else None
                out.write(f"==== workdir {cwd} does not exist on this node; starting in "
                          f"{fallback or os.getcwd()} instead ====\n".encode())
                cwd = fallback
            ids: dict[str, Any] = {} if user is None else {
                "user": user.uid, "group": user.gid, "extra_groups": list(user.groups)}
            if user is not None and self.a.runtime in USER_FLAG_RUNTIMES:
                ids = {}  # the container client runs as the agent; the container as the user (--user)
            proc = subprocess.Popen(
                launch.argv, env=launch.env, stdin=subprocess.DEVNULL, stdout=write_end,
                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True, cwd=cwd, **ids)
        except (OSError, ValueError) as exc:
            os.close(read_end)
            out.write(f"==== could not start: {exc} ====\n".encode())
            out.close()
            raise OSError(str(exc)) from exc
        finally:
            os.close(write_end)
        out.attach(read_end)
        return proc

    def reap(self, now: float) -> None:
        for rank, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None:
                continue
            del self.procs[rank]
            self.drain_controls()
            self.signal(rank, proc.pid, signal_module.SIGKILL)  # leftovers the rank spawned
            if self.container_left(rank):
                log.warning("job %s rank %d: its container is still there after the client exited; "
                            "the rank ends (and its GPUs are freed) once it is removed", self.a.job_id, rank)
                self.lingering[rank] = (code, now + LINGER_RETRY)
                continue
            self.exited(rank, code, now)
        for rank, (code, at) in list(self.lingering.items()):
            if now < at:
                continue
            self.remove_container(rank)
            if self.container_left(rank):
                self.lingering[rank] = (code, now + LINGER_RETRY)
                continue
            del self.lingering[rank]
            self.exited(rank, code, now)

    def container_left(self, rank: int) -> bool:
        """Whether the rank's runtime left something running (its container): a GPU is free only
        when its processes are gone, so a failed `rm --force` (swallowed before) kept the
        container on GPUs the node reported free. Unknown (the engine does not answer) is "left"."""
        launch = self.launches.get(rank)
        if launch is None or not launch.exists_argv:
            return False
        try:
            done = subprocess.run(launch.exists_argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            return True
        return done.returncode == 0

    def remove_container(self, rank: int) -> None:
        launch = self.launches.get(rank)
        if launch is not None and launch.kill_argv:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(launch.kill_argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=10, check=False)

    def exited(self, rank: int, code: int, now: float) -> None:
        """Record that the rank is over (its process and anything its runtime left are gone)."""
        rec = self.state["ranks"][str(rank)]
        reason = classify(self.state["mode"], code)
        rec.update(exit_code=code, exited_at=time.time(), reason=reason, cause=self.state["cause"])
        self.dirty = True
        out = self.outputs.get(rank)
        if out is not None:
            out.pump()  # what it printed last comes before its exit
            out.write(f"==== exited with code {code} ====\n".encode())
            out.close()
        if reason == "crashed" and self.state["mode"] == M_RUNNING:
            self.state.update(mode=M_FAILING, failed_rank=rank, failed_exit_code=code)
            self.terminate(self.launch.kill_grace, now)

    def drain_controls(self) -> None:
        for rank, channel in self.controls.items():
            for report in channel.read_new():
                if report.attempt != self.a.attempt:
                    continue
                self.reported.add(rank)
                self.state["checkpoints"].append({"rank": report.rank, "path": str(report.path),
                                                  "step": report.step, "at": time.time(),
                                                  "cause": self.state["cause"]})
                self.dirty = True

    # --- commands and escalation -----------------------------------------------------------------

    def read_commands(self, now: float) -> None:
        if self.term_requested:
            self.term_requested = False
            self.stop(self.launch.kill_grace, None, now)
        commands = read_commands_file(self.commands_file)
        done = int(self.state["commands_done"])
        for command in commands[done:]:
            op = command.get("op")
            try:
                if op == "stop":
                    self.stop(float(command.get("grace", self.launch.kill_grace)), command.get("cause"), now)
                elif op == "preempt":
                    self.preempt(command.get("signal"), command_grace(command), command.get("cause"), now)
                else:
                    log.warning("ignoring unknown command %r", command)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("ignoring bad command %r: %s", command, exc)
        if len(commands) > done:
            self.state["commands_done"] = len(commands)
            self.dirty = True

    def stop(self, grace: float, cause: str | None, now: float) -> None:
        if self.state["mode"] == M_RUNNING:
            self.state["mode"] = M_STOPPING
        if cause:
            self.state["cause"] = cause
        self.dirty = True
        self.terminate(grace, now)

    def preempt(self, signal_name: str | None, grace: float, cause: str | None, now: float) -> None:
        if self.state["mode"] != M_RUNNING:
            return  # already going down (crash, stop, an earlier preemption)
        self.state["mode"] = M_PREEMPTING
        if cause:
            self.state["cause"] = cause
        self.dirty = True
        grace = max(0.0, grace)
        deadline = now + grace
        self.preempting = {"deadline": deadline, "term_at": deadline - min(5.0, 0.2 * grace),
                           "reported_at": None, "termed": False, "killed": False}
        sig = signal_from_name(signal_name or self.a.checkpoint_signal)
        for rank in self.live_procs():
            self.signal(rank, self.procs[rank].pid, sig)

    def signal(self, rank: int, pgid: int, sig: int) -> None:
        """Signal a rank's process group as its runtime wants: a sandbox's bwrap (the leader) dies of
        any signal, taking the job along, so it gets only SIGKILL; after a SIGKILL, a container the
        client leaves behind is removed."""
        launch = self.launches.get(rank)
        if launch is not None and launch.spare_leader and sig != signal_module.SIGKILL:
            signal_group_members(pgid, sig, spare=pgid)
        else:
            signal_group(pgid, sig)
        if sig == signal_module.SIGKILL:
            self.remove_container(rank)

    def live_procs(self) -> list[int]:
        return sorted(self.procs)

    def terminate(self, grace: float, now: float) -> None:
        for rank in self.live_procs():
            self.signal(rank, self.procs[rank].pid, signal_module.SIGTERM)
        at = now + grace
        self.kill_at = at if self.kill_at is None else min(self.kill_at, at)

    def escalate(self, now: float) -> None:
        p = self.preempting
        if p is not None and self.procs:
            if not p["termed"]:
                reported = self.whole_gang_here() and all(r in self.reported for r in self.procs)
                if p["reported_at"] is None and reported:
                    p["reported_at"] = now
                term_time = p["term_at"] if p["reported_at"] is None else min(p["term_at"],
                                                                              p["reported_at"] + EXIT_AFTER_REPORT)
                if now >= term_time:
                    p["termed"] = True
                    for rank in self.live_procs():
                        self.signal(rank, self.procs[rank].pid, signal_module.SIGTERM)
            if now >= p["deadline"] and not p["killed"]:
                p["killed"] = True
                self.kill_all("preemption deadline")
        if self.kill_at is not None and now >= self.kill_at and self.procs:
            self.kill_at = None
            self.kill_all("grace over")

    def whole_gang_here(self) -> bool:
        """Whether every rank of the gang runs under this stepd. Only then do the local reports say
        the checkpoint is done: a rank that reported may wait in a collective for peers on other
        nodes still writing theirs, and is termed at the grace's own time, not soon after."""
        return len(self.a.ranks) >= self.a.world_size

    def kill_all(self, why: str) -> None:
        for rank in self.live_procs():
            log.warning("job %s rank %d still runs (%s); SIGKILL", self.a.job_id, rank, why)
            self.signal(rank, self.procs[rank].pid, signal_module.SIGKILL)


#: Ignored by the interpreter itself and restored by `subprocess.Popen` (`restore_signals`) in
#: every child; at their default here, a write to a closed pipe would end the stepd.
_INTERPRETER_IGNORES = {signal_module.SIGPIPE, signal_module.SIGXFSZ}


def default_inherited_ignores() -> None:
    """Sets every signal this process inherited ignored back to its default: an ignored signal
    survives exec, so an agent started with `&` or under nohup (SIGINT, SIGQUIT, SIGHUP ignored)
    would otherwise hand that to every rank, which then could not be interrupted."""
    for sig in signal_module.valid_signals():
        if sig in _INTERPRETER_IGNORES or sig in (signal_module.SIGKILL, signal_module.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            if signal_module.getsignal(sig) == signal_module.SIG_IGN:
                signal_module.signal(sig, signal_module.SIG_DFL)


def _nothing(signum: int, frame: FrameType | None) -> None:
    """A Python handler, so that the signal reaches the wake-up pipe (SIGCHLD is ignored by default)."""


def main(argv: list[str] | None = None, term_requested: Callable[[], bool] = lambda: False) -> int:
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=environment.get("CORRAL_LOG_LEVEL") or "INFO",
                        format="%(asctime)s stepd[%(process)d] %(levelname)s %(message)s")
    if len(args) != 1:
        print("usage: python -m corral.services.node_agent.process.stepd <attempt-dir>", file=sys.stderr)
        return 2
    folder = Path(args[0])
    launch = read_launch(folder)
    if launch is None:
        print(f"stepd: {folder}/launch.json is missing or unreadable", file=sys.stderr)
        return 2
    return Stepd(folder, launch).run(term_requested)


if __name__ == "__main__":
    sys.exit(main())
