"""The agent's side of the stepd fork server (`zygote`): start it, ask it for stepds, let it go.

The server is a plain child process (`subprocess.Popen`) read through the event loop: an asyncio
subprocess transport kills a child still running when it is closed or collected, and the server,
as the stepd host (`stepd_host`), runs on past the agent while it holds gangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from .step_files import STEPD_LOG, process_start_time

log = logging.getLogger(__name__)


class ForkServer:
    """The agent's side: starts the server on first use (and again if it died) and asks it for
    stepds. When the server cannot be started or answer, a stepd is started as a fresh interpreter
    (`spawn` then returns the Popen, whose owner waits for it)."""

    def __init__(self, python: str, env: Mapping[str, str], *, host: bool = True) -> None:
        self._python = python
        self._env = dict(env)
        self._host = host  # gangs of a hosted runtime run in the server itself (`stepd_host`)
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: asyncio.StreamReader | None = None
        self._transport: asyncio.BaseTransport | None = None
        self._lock: asyncio.Lock | None = None
        self._ids = 0
        self._disabled = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    async def _server(self) -> tuple[subprocess.Popen[bytes], asyncio.StreamReader]:
        if self._proc is not None and self._reader is not None and self._proc.poll() is None:
            return self._proc, self._reader
        await self._discard()
        proc = subprocess.Popen(
            [self._python, "-m", "corral.services.node_agent.process.zygote"], env=self._env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True, close_fds=True)
        assert proc.stdout is not None
        reader = asyncio.StreamReader()
        self._transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), proc.stdout)
        self._proc, self._reader = proc, reader
        return proc, reader

    async def _ask(self, folder: Path, runtime: str) -> tuple[int, str | None, bool]:
        proc, reader = await self._server()
        assert proc.stdin is not None
        self._ids += 1
        request = {"id": self._ids, "folder": str(folder), "host": self._host, "runtime": runtime}
        data = json.dumps(request).encode() + b"\n"
        while data:  # a line of a few hundred bytes: the pipe takes it at once
            data = data[os.write(proc.stdin.fileno(), data):]
        line = await reader.readline()
        if not line:
            raise ConnectionError("the stepd fork server ended")
        reply = json.loads(line)
        if "error" in reply:
            raise OSError(reply["error"])
        return int(reply["pid"]), reply.get("started"), bool(reply.get("shared"))

    async def spawn(self, folder: Path,
                    runtime: str = "process") -> tuple[int, str | None, subprocess.Popen[bytes] | None, bool]:
        """Start the stepd of the attempt in `folder`: (pid, start time, the Popen if not forked,
        whether the stepd is shared: the host's). OSError when it could not be started at all."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        if not self._disabled:
            async with self._lock:
                for _ in range(2):  # a server that died (killed) is started again once
                    try:
                        pid, started, shared = await self._ask(folder, runtime)
                        return pid, started, None, shared
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
        return proc.pid, process_start_time(proc.pid), proc, False

    async def _discard(self) -> None:
        """Let the server go: no more requests (its stdin closed). It is not killed: the gangs it
        hosts run on, and it exits after the last (see `stepd_host`)."""
        proc, self._proc = self._proc, None
        transport, self._transport = self._transport, None
        reader, self._reader = self._reader, None
        if proc is not None and proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        if reader is not None and proc is not None and proc.poll() is None:
            with contextlib.suppress(Exception):  # it closes its end once it read ours
                await asyncio.wait_for(reader.read(), 5.0)
        if transport is not None:
            transport.close()
        if proc is None:
            return
        for _ in range(20):  # one holding no gang exits at once: reaped here
            if proc.poll() is not None:
                return
            await asyncio.sleep(0.01)
        _LEFT.append(proc)

    async def close(self) -> None:
        """End the server's service to this agent; its stepds and hosted gangs keep running."""
        await self._discard()
        for proc in list(_LEFT):
            if proc.poll() is not None:
                _LEFT.remove(proc)


#: Servers let go while they still hosted gangs: polled (reaped) at each close.
_LEFT: list[subprocess.Popen[bytes]] = []
