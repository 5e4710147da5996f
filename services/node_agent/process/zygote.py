"""`python -m corral.services.node_agent.process.zygote`: a warm fork server for stepds.

A stepd started as a fresh interpreter (`python -m ...stepd`) would pay an interpreter start and
its imports for every gang attempt, tens of milliseconds of CPU per job; this process imports the
stepd once and forks one per request: a fork of a small, already-imported process is a millisecond.

Its promises are the stepd's: each forked stepd runs `stepd.main` in its own session with its
output in the attempt's `stepd.log` (made at its first write: a gang that goes well writes
nothing there, and a file not made is an inode not paid for), as a fresh one would, and outlives both this process
and the agent. The agent starts one fork server (`fork_server.ForkServer`) with the environment
its stepds start from; the server lives as long as the agent: it exits at the end of its standard
input (the agent stopped or died), leaving its stepds running (they are then reparented, as
after any agent restart, and adopted from their files by the next agent). It reaps the stepds
that end while it runs.

It imports the stepd and little else (no asyncio): every page it holds is a page each fork maps.

It is also the stepd host (`stepd_host`): a request with `"host": true` for a gang of a hosted
runtime runs that gang in this process's own loop instead of a forked stepd; the host's failure
domain and lifetime are described there. With gangs held, it outlives the end of its standard
input until the last of them ends.

Protocol, one JSON line each way on stdin/stdout: `{"id": N, "folder": PATH, "host": BOOL}` in,
`{"id": N, "pid": PID, "started": START, "shared": BOOL}` or `{"id": N, "error": TEXT}` out.

Signals that reach a stepd before it set its own handlers (the agent learns the pid as soon as
the fork returns) are the ones it would get later: the wake-up signal is harmless (this process
holds a no-op handler, which the fork inherits) and SIGTERM is remembered and carried out as a
stop once the stepd runs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal as signal_module
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from . import stepd, stepd_host
from .step_files import STEPD_LOG, WAKE_SIGNAL, process_start_time

REAP_EVERY = 0.5  # seconds between reaps of ended stepds while no request comes
_SERVER_PID = os.getpid()
_early_term = False


def _on_term(signum: int, frame: FrameType | None) -> None:
    """The server stops its hosted gangs and ends on SIGTERM (the wake-up pipe says it); a stepd
    forked a moment ago remembers it (a stop)."""
    global _early_term
    if os.getpid() != _SERVER_PID:
        _early_term = True


def _wake(signum: int, frame: FrameType | None) -> None:
    """The stepd's wake-up signal, received before it set its own handler: nothing to do."""


def _name_setter() -> Callable[[bytes], None]:
    """Sets the process's name (its `comm`, what ps and top show), looked up once in the server:
    a forked stepd imports nothing."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None).prctl
    except (ImportError, OSError, AttributeError):
        return lambda name: None

    def set_name(name: bytes) -> None:
        with contextlib.suppress(Exception):
            prctl(15, name, 0, 0, 0)  # PR_SET_NAME

    return set_name


_set_name = _name_setter()


class _LazyLog:
    """The stepd's stdout and stderr: `stepd.log`, opened at the first write (text, appended)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd = -1

    def write(self, text: str) -> int:
        if self._fd < 0:
            self._fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                               0o644)
        data = text.encode(errors="replace")
        while data:
            data = data[os.write(self._fd, data):]
        return len(text)

    def flush(self) -> None:
        """Every write is the file's already."""


def _child(folder: str) -> None:
    """The forked stepd: its own session, its log as stdout and stderr, then `stepd.main`."""
    code = 1
    try:
        signal_module.set_wakeup_fd(-1)  # the server's; the stepd sets its own
        logging.getLogger().handlers.clear()  # the host's; the stepd sets up its own
        signal_module.pthread_sigmask(signal_module.SIG_UNBLOCK, _HELD)  # what came meanwhile is handled now
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, 1 << 16)
        sys.stdout = sys.stderr = _LazyLog(Path(folder) / STEPD_LOG)
        _set_name(b"corral-stepd")
        code = stepd.main([folder], term_requested=lambda: _early_term)
    except BaseException:  # whatever it is goes to stepd.log, and the stepd exits
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


#: Blocked around the fork: one that reaches the child before the interpreter's after-fork
#: reset (the agent has the pid as soon as the fork returns here) would be dropped by it.
_HELD = {signal_module.SIGTERM, WAKE_SIGNAL}


def _fork(folder: str, forked: set[int]) -> dict[str, object]:
    signal_module.pthread_sigmask(signal_module.SIG_BLOCK, _HELD)
    try:
        pid = os.fork()
    except OSError as exc:
        return {"error": f"fork failed: {exc}"}
    finally:
        if os.getpid() == _SERVER_PID:
            signal_module.pthread_sigmask(signal_module.SIG_UNBLOCK, _HELD)
    if pid == 0:
        _child(folder)
    forked.add(pid)
    return {"pid": pid, "started": process_start_time(pid), "shared": False}


def _serve_one(request: dict[str, object], host: stepd_host.Host, forked: set[int]) -> dict[str, object]:
    folder = str(request["folder"])
    runtime = request.get("runtime")
    if request.get("host") and runtime in stepd_host.HOSTED_RUNTIMES:
        error = host.add(Path(folder))
        if error is not None:
            return {"error": error}
        return {"pid": _SERVER_PID, "started": _STARTED, "shared": True}
    return _fork(folder, forked)


def serve() -> int:
    global _STARTED
    _STARTED = process_start_time(_SERVER_PID)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal_module.set_wakeup_fd(wake_w)
    signal_module.signal(signal_module.SIGTERM, _on_term)
    signal_module.signal(WAKE_SIGNAL, _wake)
    signal_module.signal(signal_module.SIGCHLD, _wake)
    stepd.default_inherited_ignores()
    gang_log = stepd_host.GangLog()
    stepd_host.default_log(gang_log)
    _set_name(b"corral-stepds")
    host = stepd_host.Host(gang_log, started=_STARTED)
    host.watch(wake_r)
    host.watch(0)
    forked: set[int] = set()
    pending = b""
    reading = True
    while reading or host.gangs:
        wait = min(REAP_EVERY, host.due_in(time.monotonic()))
        ready = host.ready(wait)
        signals = b""
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(wake_r, 512):
                signals += chunk
        woken, term = stepd_host.wake_signals(signals)
        host.pump(ready)
        host.reap(time.monotonic(), forked)
        if term:
            if not host.gangs:
                return 0
            host.stop_all()
            if reading:  # no new gangs: the agent finds the pipes closed and starts another server
                reading = False
                host.unwatch(0)
                os.close(0)
                os.close(1)
        if reading and 0 in ready:
            chunk = os.read(0, 65536)
            if not chunk:
                reading = False  # the agent is gone: no new gangs; the ones held run to their end
                host.unwatch(0)
                os.close(1)
            pending += chunk
            while b"\n" in pending and reading:
                line, pending = pending.split(b"\n", 1)
                try:
                    request = json.loads(line)
                    reply = {"id": request.get("id"), **_serve_one(request, host, forked)}
                except (ValueError, KeyError, TypeError, AttributeError) as exc:
                    reply = {"id": None, "error": f"bad request: {exc}"}
                data = json.dumps(reply).encode() + b"\n"
                while data:
                    data = data[os.write(1, data):]
        host.run_due(time.monotonic(), woken=woken)
    return 0


_STARTED: str | None = None


if __name__ == "__main__":
    from corral.profiling import profiled

    with profiled("stepd-host"):  # CORRAL_PROFILE_DIR, CORRAL_PROFILE_ONLY=stepd-host: the host's own loop
        code = serve()
    sys.exit(code)
