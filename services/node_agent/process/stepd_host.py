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
import logging
import math
import os
import select
import signal as signal_module
import time
from collections.abc import Iterator
from pathlib import Path

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
    """The gangs this process is the stepd of, each with when its loop is next due (monotonic)."""

    def __init__(self, gang_log: GangLog) -> None:
        self.gangs: dict[Stepd, float] = {}
        self._log = gang_log
        self._outputs: dict[int, tuple[Stepd, RankOutput]] = {}

    def add(self, folder: Path) -> str | None:
        """Start the gang of `folder` here; the reason when it is not for the host (None: hosted)."""
        launch = read_launch(folder)
        if launch is None:
            return f"{folder}/launch.json is missing or unreadable"
        gang = Stepd(folder, launch)
        gang.state["stepd_shared"] = True
        with self._handling(gang):
            try:
                code = gang.begin()
            except Exception:
                log.exception("%s: the host failed starting this gang; killing what started", gang.folder)
                fail(gang, "the stepd host failed starting this gang")
                return None
        if code is None:
            self.gangs[gang] = time.monotonic()
        return None

    def stop_all(self) -> None:
        """SIGTERM to the host: a stop of every gang it holds."""
        for gang in self.gangs:
            gang.term_requested = True
            self.gangs[gang] = 0.0

    def fds(self) -> list[int]:
        """The ranks' output pipes, to wait on."""
        self._outputs = {fd: (gang, out) for gang in self.gangs for fd, out in gang.pipes().items()}
        return list(self._outputs)

    def pump(self, ready: list[int]) -> None:
        """Copy what the ranks wrote to their logs (output alone does not run a gang's loop)."""
        for fd in ready:
            if fd in self._outputs:
                gang, out = self._outputs[fd]
                with self._handling(gang):
                    out.pump(until_empty=False)

    def due_in(self, now: float) -> float:
        return max(0.0, min(self.gangs.values(), default=now + 3600.0) - now)

    def run_due(self, now: float, *, woken: bool, sigchld: bool) -> None:
        """Run the loop of each gang that is due: its time came, the agent woke us (a command for
        one of them: every gang looks), or one of its ranks exited (SIGCHLD does not say whose:
        each gang looks at its own, a waitpid per live rank)."""
        for gang, due in list(self.gangs.items()):
            if not (woken or now >= due or (sigchld and any(p.poll() is not None for p in gang.procs.values()))):
                continue
            with self._handling(gang):
                try:
                    going = gang.tick(now)
                except Exception:
                    log.exception("%s: the host failed handling this gang; killing its ranks", gang.folder)
                    fail(gang, "the stepd host failed handling this gang; the rank was killed")
                    going = False
            if going:
                self.gangs[gang] = now + gang.timeout(now)
            else:
                del self.gangs[gang]

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


def wake_signals(data: bytes) -> tuple[bool, bool, bool]:
    """What the wake-up pipe's bytes say: (a rank or stepd exited, the agent woke us, SIGTERM)."""
    return (signal_module.SIGCHLD in data, WAKE_SIGNAL in data, signal_module.SIGTERM in data)


def default_log(gang_log: GangLog) -> None:
    from corral import environment

    root = logging.getLogger()
    root.handlers[:] = [gang_log]
    root.setLevel(environment.get("CORRAL_LOG_LEVEL") or "INFO")



def ready(fds: list[int], timeout: float) -> list[int]:
    """The descriptors of `fds` ready to read (or closed) within `timeout` seconds. poll, not
    select: the host holds every hosted rank's pipe and log, fd numbers select cannot take."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    try:
        events = poller.poll(max(0, math.ceil(timeout * 1000)))
    except InterruptedError:
        return []
    return [fd for fd, _ in events]
