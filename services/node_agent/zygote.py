"""`python -m corral.services.node_agent.zygote`: a warm fork server for stepds.

The problem: a stepd per gang attempt started as a fresh interpreter (`python -m ...stepd`) costs
an interpreter start and its imports, tens of milliseconds of CPU per job and more in latency on
a busy machine; Slurm's slurmstepd is a C program. This process imports the stepd once and forks
one per request: a fork of a small, already-imported process is a millisecond.

Its promises are the stepd's: each forked stepd runs `stepd.main` in its own session with its
output in the attempt's `stepd.log`, exactly as a fresh one would, and outlives both this process
and the agent. The agent starts one fork server (`ForkServer`, below) with the environment its
stepds start from; the server lives as long as the agent: it exits at the end of its standard
input (the agent stopped or died), leaving its stepds running (they are then reparented, as
after any agent restart, and adopted from their files by the next agent). It reaps the stepds
that end while it runs.

Protocol, one JSON line each way on stdin/stdout: `{"id": N, "folder": PATH}` in,
`{"id": N, "pid": PID, "started": START}` or `{"id": N, "error": TEXT}` out.

Signals that reach a stepd before it set its own handlers (the agent learns the pid as soon as
the fork returns) are the ones it would get later: the wake-up signal is harmless (this process
holds a no-op handler, which the fork inherits) and SIGTERM is remembered and carried out as a
stop once the stepd runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import select
import signal as signal_module
import subprocess
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

from . import stepd
from .step_files import STEPD_LOG, WAKE_SIGNAL, process_start_time

log = logging.getLogger(__name__)

REAP_EVERY = 0.5  # seconds between reaps of ended stepds while no request comes
_SERVER_PID = os.getpid()
_early_term = False


def _on_term(signum: int, frame: FrameType | None) -> None:
    """The server ends on SIGTERM; a stepd forked a moment ago remembers it (a stop)."""
    global _early_term
    if os.getpid() == _SERVER_PID:
        raise SystemExit(0)
    _early_term = True


def _wake(signum: int, frame: FrameType | None) -> None:
    """The stepd's wake-up signal, received before it set its own handler: nothing to do."""


def _set_name(name: bytes) -> None:
    """Name the process (its `comm`, what ps and top show): a forked stepd is not the server."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(15, name, 0, 0, 0)  # PR_SET_NAME


def _child(folder: str) -> None:
    """The forked stepd: its own session, its log as stdout and stderr, then `stepd.main`."""
    code = 1
    try:
        os.setsid()
        out = os.open(Path(folder) / STEPD_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.closerange(3, 1 << 16)
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


def _fork(folder: str) -> dict[str, object]:
    try:
        pid = os.fork()
    except OSError as exc:
        return {"error": f"fork failed: {exc}"}
    if pid == 0:
        _child(folder)
    return {"pid": pid, "started": process_start_time(pid)}


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] != 0:
            pass


def serve() -> int:
    signal_module.signal(signal_module.SIGTERM, _on_term)
    signal_module.signal(WAKE_SIGNAL, _wake)
    pending = b""
    while True:
        ready, _, _ = select.select([0], [], [], REAP_EVERY)
        _reap()
        if not ready:
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            return 0  # the agent is gone: so are we; the stepds stay
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            try:
                request = json.loads(line)
                reply = {"id": request.get("id"), **_fork(str(request["folder"]))}
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                reply = {"id": None, "error": f"bad request: {exc}"}
            data = json.dumps(reply).encode() + b"\n"
            while data:
                data = data[os.write(1, data):]


class ForkServer:
    """The agent's side: starts the server on first use (and again if it died) and asks it for
    stepds. When the server cannot be started or answer, a stepd is started as a fresh interpreter
    as before (`spawn` then returns the Popen, whose owner waits for it)."""

    def __init__(self, python: str, env: Mapping[str, str]) -> None:
        self._python = python
        self._env = dict(env)
        self._proc: asyncio.subprocess.Process | None = None
        self._lock: asyncio.Lock | None = None
        self._ids = 0
        self._disabled = False

    async def _server(self) -> asyncio.subprocess.Process:
        if self._proc is not None and self._proc.returncode is None:
            return self._proc
        self._proc = await asyncio.create_subprocess_exec(
            self._python, "-m", "corral.services.node_agent.zygote", env=self._env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, start_new_session=True, close_fds=True)
        return self._proc

    async def _ask(self, folder: Path) -> tuple[int, str | None]:
        proc = await self._server()
        assert proc.stdin is not None and proc.stdout is not None
        self._ids += 1
        proc.stdin.write(json.dumps({"id": self._ids, "folder": str(folder)}).encode() + b"\n")
        await proc.stdin.drain()
        line = await proc.stdout.readline()
        if not line:
            raise ConnectionError("the stepd fork server ended")
        reply = json.loads(line)
        if "error" in reply:
            raise OSError(reply["error"])
        return int(reply["pid"]), reply.get("started")

    async def spawn(self, folder: Path) -> tuple[int, str | None, subprocess.Popen[bytes] | None]:
        """Start the stepd of the attempt in `folder`: (pid, start time, the Popen if not forked).
        OSError when it could not be started at all."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        if not self._disabled:
            async with self._lock:
                for _ in range(2):  # a server that died (killed) is started again once
                    try:
                        pid, started = await self._ask(folder)
                        return pid, started, None
                    except OSError as exc:
                        if not isinstance(exc, ConnectionError | BrokenPipeError | ConnectionResetError):
                            raise
                        log.warning("the stepd fork server is gone (%s); starting it again", exc)
                        await self._discard()
                    except ValueError as exc:
                        log.warning("the stepd fork server answered nonsense (%s); starting it again", exc)
                        await self._discard()
                log.error("the stepd fork server does not work; starting each stepd as a new interpreter")
                self._disabled = True
        with (folder / STEPD_LOG).open("ab") as out:
            proc = subprocess.Popen(
                [self._python, "-m", "corral.services.node_agent.stepd", str(folder)], env=self._env,
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                close_fds=True)
        return proc.pid, process_start_time(proc.pid), proc

    async def _discard(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(), 5.0)

    async def close(self) -> None:
        """End the server (its stepds keep running)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        assert proc.stdin is not None
        with contextlib.suppress(Exception):
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 5.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(Exception):
                await proc.wait()


if __name__ == "__main__":
    sys.exit(serve())
