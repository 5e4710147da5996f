"""The agent's side of the stepd fork server (`zygote`): start it, ask it for stepds, end it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
from collections.abc import Mapping
from pathlib import Path

from .step_files import STEPD_LOG, process_start_time

log = logging.getLogger(__name__)


class ForkServer:
    """The agent's side: starts the server on first use (and again if it died) and asks it for
    stepds. When the server cannot be started or answer, a stepd is started as a fresh interpreter
    (`spawn` then returns the Popen, whose owner waits for it)."""

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
            self._python, "-m", "corral.services.node_agent.process.zygote", env=self._env, stdin=subprocess.PIPE,
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
                [self._python, "-m", "corral.services.node_agent.process.stepd", str(folder)], env=self._env,
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
