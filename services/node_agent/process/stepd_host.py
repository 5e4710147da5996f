"""One process that is the stepd of many gangs on a node: the fork server's own loop (`zygote`).

Why: a stepd forked per gang is a copy of a Python heap, and the copy is most of what a short
job costs the node: the fork and exit, and hundreds of copy-on-write page faults as the child
touches what it shares. The host runs each gang's `stepd.Stepd` in its own loop instead: a gang
is an object here, its ranks are this process's children (started with vfork + exec), and its
files are the same as a forked stepd's (`step_files`: launch.json in, state.json out, commands
and checkpoint reports read the same way), so the agent follows, commands and adopts a hosted
gang exactly as one with its own stepd. Its state names this process as the stepd
(`stepd_pid`, `stepd_started`) and says it is shared (`stepd_shared`).

Failure domain: the host is every hosted gang's supervision at once. When it dies (kill -9, a
crash), the agent finds their stepd gone and does what it does for any dead stepd: it kills what
is left of each gang's ranks and reports them crashed (`supervisor._stepd_died`): every gang it
held fails, not one. A bug in one gang's handling is kept to that gang: its ranks are killed and
its end written as failed, the others run on. SIGTERM to the host stops every gang it holds (as
SIGTERM to a stepd stops its gang); the agent sends a shared stepd commands only through
commands.json and the wake-up signal, never SIGTERM.

It hosts the plain `process` runtime only: a sandbox's or a container's rank is stopped and
cleaned up through commands the stepd runs and waits for (the container engine's client), which
would hold up every gang of the loop; those, and gangs when the agent asks for no host, get a
forked stepd as before.

Lifetime: it takes new gangs while the agent is connected (its stdin); once the agent is gone
(EOF, or the agent was killed) it takes none, finishes the gangs it holds and exits after the
last, while the next agent process starts a host of its own and adopts these gangs from their
files.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import math
import os
import select
import signal as signal_module
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from corral import environment

from .rank_output import RankOutput
from .step_files import ENDED, STEPD_LOG, WAKE_SIGNAL, read_launch, signal_group
from .stepd import Stepd

log = logging.getLogger("corral.stepd")

HOSTED_RUNTIMES = frozenset({"process"})


class GangLog(logging.Handler):
    """Routes the stepd's log records to the `stepd.log` of the gang being handled (opened for
    each record: a gang that goes well writes none), others to the host's standard error."""

    def __init__(self) -> None:
        super().__init__()
        self.folder: Path | None = None
        self.setFormatter(logging.Formatter("%(asctime)s stepd-host[%(process)d] %(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = (self.format(record) + "\n").encode(errors="replace")
            if self.folder is None:
                os.write(2, line)
                return
            fd = os.open(self.folder / STEPD_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        except Exception:  # a log line never takes a gang down
            self.handleError(record)


class Host:
    """The gangs this process is the stepd of, each with when its loop is next due (monotonic).

    Each pass of the server's loop costs what happened, not how many gangs there are: the ranks'
    pipes stay registered in one poller (`_track` after whatever may open or close them), a gang
    is found due from a heap of due times, and a rank's exit is found by asking the kernel which
    child is waitable (`reap`: the exit's own gang runs, not every gang)."""

    def __init__(self, gang_log: GangLog, *, started: str | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self.gangs: dict[Stepd, float] = {}
        self._log = gang_log
        self._started = started  # this process's start time: every hosted gang's `stepd_started`
        # The ranks' environment starts from this process's, which nothing changes once it runs.
        self._env = dict(environment.mapping() if env is None else env)
        self._poller = select.poll()
        self._outputs: dict[int, tuple[Stepd, RankOutput]] = {}  # a registered pipe -> its rank's log
        self._gang_fds: dict[Stepd, tuple[int, ...]] = {}
        self._ranks: dict[int, tuple[Stepd, subprocess.Popen[bytes]]] = {}  # a rank's pid -> its gang
        self._gang_pids: dict[Stepd, tuple[int, ...]] = {}
        self._due: list[tuple[float, int, Stepd]] = []  # (due, tie, gang), stale entries skipped
        self._ties = itertools.count()

    def add(self, folder: Path) -> str | None:
        """Start the gang of `folder` here; the reason when it is not for the host (None: hosted)."""
        launch = read_launch(folder)
        if launch is None:
            return f"{folder}/launch.json is missing or unreadable"
        gang = Stepd(folder, launch, base_env=self._env, stepd_started=self._started)
        gang.state["stepd_shared"] = True
        with self._handling(gang):
            try:
                code = gang.begin()
            except Exception:
                log.exception("%s: the host failed starting this gang; killing what started", gang.folder)
                fail(gang, "the stepd host failed starting this gang")
                code = 1
        if code is None:
            self._schedule(gang, time.monotonic())
        self._track(gang)
        return None

    def stop_all(self) -> None:
        """SIGTERM to the host: a stop of every gang it holds."""
        now = time.monotonic()
        for gang in self.gangs:
            gang.term_requested = True
            self._schedule(gang, now)

    def watch(self, fd: int) -> None:
        """Wait on `fd` too (the wake-up pipe, the agent's requests)."""
        self._poller.register(fd, select.POLLIN)

    def unwatch(self, fd: int) -> None:
        with contextlib.suppress(KeyError):
            self._poller.unregister(fd)

    def ready(self, timeout: float) -> list[int]:
        """The watched descriptors and ranks' pipes ready to read (or closed) within `timeout` seconds."""
        try:
            events = self._poller.poll(max(0, math.ceil(timeout * 1000)))
        except InterruptedError:
            return []
        return [fd for fd, _ in events]

    def pump(self, ready: list[int]) -> None:
        """Copy what the ranks wrote to their logs (output alone does not run a gang's loop)."""
        for fd in ready:
            found = self._outputs.get(fd)
            if found is not None:
                gang, out = found
                with self._handling(gang):
                    out.pump(until_empty=False)
                if out.pipe is None:  # the rank and what it spawned closed it
                    self._track(gang)

    def due_in(self, now: float) -> float:
        while self._due and self.gangs.get(self._due[0][2]) != self._due[0][0]:
            heapq.heappop(self._due)  # a gang that ended, or was rescheduled
        return max(0.0, self._due[0][0] - now) if self._due else 3600.0

    def reap(self, now: float, forked: set[int]) -> None:
        """Run the gang of each rank that exited (the kernel says which child is waitable, without
        reaping it: the gang's own `Popen` does), and reap the forked stepds that ended. A signal
        that never came (the wake-up pipe full) costs nothing: this asks on every pass."""
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or not info.si_pid:
                return
            pid = info.si_pid
            owner = self._ranks.pop(pid, None)
            if owner is None:  # a forked stepd (or nobody's): reaped here
                forked.discard(pid)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
                continue
            gang, proc = owner
            if gang in self.gangs:
                self._tick(gang, now)
            if proc.returncode is None:  # its gang did not reap it (it failed): its Popen keeps the code
                proc.poll()
                self._track(gang)

    def run_due(self, now: float, *, woken: bool) -> None:
        """Run the loop of each gang that is due, or of every gang when the agent woke us (a
        command for one of them: every gang looks)."""
        if woken:
            for gang in list(self.gangs):
                if gang in self.gangs:
                    self._tick(gang, now)
            return
        due: list[Stepd] = []
        while self._due and self._due[0][0] <= now:  # each once a pass: one due again at once waits a poll
            at, _, gang = heapq.heappop(self._due)
            if self.gangs.get(gang) == at:
                due.append(gang)
        for gang in due:
            if gang in self.gangs:
                self._tick(gang, now)

    def _schedule(self, gang: Stepd, due: float) -> None:
        self.gangs[gang] = due
        heapq.heappush(self._due, (due, next(self._ties), gang))

    def _tick(self, gang: Stepd, now: float) -> None:
        with self._handling(gang):
            try:
                going = gang.tick(now)
            except Exception:
                log.exception("%s: the host failed handling this gang; killing its ranks", gang.folder)
                fail(gang, "the stepd host failed handling this gang; the rank was killed")
                going = False
        if going:
            self._schedule(gang, now + gang.timeout(now))
        else:
            del self.gangs[gang]
        self._track(gang)

    def _track(self, gang: Stepd) -> None:
        """Register the gang's open pipes with the poller and forget those it closed (at once:
        the number of a closed pipe is the next one opened); likewise its ranks not reaped yet
        (a reaped rank's pid may be the next child's)."""
        live = {proc.pid: proc for proc in gang.procs.values() if proc.returncode is None}
        for pid in self._gang_pids.pop(gang, ()):
            if pid not in live and self._ranks.get(pid, (None,))[0] is gang:
                del self._ranks[pid]
        for pid, proc in live.items():
            self._ranks[pid] = (gang, proc)
        if live:
            self._gang_pids[gang] = tuple(live)
        before = self._gang_fds.pop(gang, ())
        now = {fd: out for fd, out in gang.pipes().items()} if gang in self.gangs else {}
        for fd in before:
            if fd not in now:
                self._outputs.pop(fd, None)
                with contextlib.suppress(KeyError):
                    self._poller.unregister(fd)
        for fd, out in now.items():
            if fd not in before:
                self._poller.register(fd, select.POLLIN)
                self._outputs[fd] = (gang, out)
        if now:
            self._gang_fds[gang] = tuple(now)

    @contextlib.contextmanager
    def _handling(self, gang: Stepd) -> Iterator[None]:
        self._log.folder = gang.folder
        try:
            yield
        finally:
            self._log.folder = None


def fail(gang: Stepd, message: str) -> None:
    """End a gang its handling failed on: its ranks killed and recorded as crashed, its end failed."""
    now = time.time()
    for proc in gang.procs.values():
        signal_group(proc.pid, signal_module.SIGKILL)
    for rank, rec in gang.state["ranks"].items():
        if rec.get("exited_at") is None:
            rec.update(exited_at=now, exit_code=None, reason="crashed", message=message)
            if gang.state.get("failed_rank") is None:
                gang.state["failed_rank"] = int(rank)
    for out in gang.outputs.values():
        with contextlib.suppress(OSError):
            out.close()
    gang.state.update(phase=ENDED, mode="failing", end="failed")
    gang.save()


def wake_signals(data: bytes) -> tuple[bool, bool]:
    """What the wake-up pipe's bytes say: (the agent woke us, SIGTERM). SIGCHLD only wakes the
    loop: which child exited is asked of the kernel (`Host.reap`)."""
    return (WAKE_SIGNAL in data, signal_module.SIGTERM in data)


def default_log(gang_log: GangLog) -> None:
    root = logging.getLogger()
    root.handlers[:] = [gang_log]
    root.setLevel(environment.get("CORRAL_LOG_LEVEL") or "INFO")
