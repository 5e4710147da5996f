"""The agent's side of the stepd fork server (`zygote`): start it, ask it for stepds, let it go.

The server is a plain child process (`subprocess.Popen`) read through the event loop: an asyncio
subprocess transport kills a child still running when it is closed or collected, and the server,
as the stepd host (`stepd_host`), runs on past the agent while it holds gangs.

Requests are pipelined: each is a line with its id, written without waiting for the answers to
the ones before (one reader task matches each answer to its request by id). A start waits for the
server's round trip (a fork, or the host starting the gang's ranks); one at a time, the agent's
starts would be as many a second as round trips fit in one, whatever else the agent could do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .step_files import STEPD_LOG, process_start_time

log = logging.getLogger(__name__)


class _Nonsense(ConnectionError):
    """The server answered something that is not an answer: it is let go like a dead one."""


@dataclass(eq=False)
class _Connection:
    """One server process and the requests it has not answered yet (id -> its answer)."""

    proc: subprocess.Popen[bytes]
    requests: asyncio.WriteTransport
    answers: asyncio.BaseTransport
    reader: asyncio.StreamReader
    waiting: dict[int, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None

    def fail(self, exc: ConnectionError) -> None:
        waiting, self.waiting = self.waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(exc)


class ForkServer:
    """The agent's side: starts the server on first use (and again if it died) and asks it for
    stepds. When the server cannot be started or answer, a stepd is started as a fresh interpreter
    (`spawn` then returns the Popen, whose owner waits for it)."""

    def __init__(self, python: str, env: Mapping[str, str], *, host: bool = True) -> None:
        self._python = python
        self._env = dict(env)
        self._host = host  # gangs of a hosted runtime run in the server itself (`stepd_host`)
        self._conn: _Connection | None = None
        self._lock: asyncio.Lock | None = None  # held while a server is started or let go
        self._ids = 0
        self._disabled = False

    @property
    def pid(self) -> int | None:
        return self._conn.proc.pid if self._conn is not None else None

    async def _server(self) -> _Connection:
        conn = self._conn
        if conn is not None and conn.proc.poll() is None and conn.task is not None and not conn.task.done():
            return conn
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._conn is not conn:  # another request started one meanwhile
                return await self._server()
            await self._discard()
            proc = subprocess.Popen(
                [self._python, "-m", "corral.services.node_agent.process.zygote"], env=self._env,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True, close_fds=True)
            assert proc.stdin is not None and proc.stdout is not None
            loop = asyncio.get_running_loop()
            reader = asyncio.StreamReader()
            answers, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), proc.stdout)
            requests, _ = await loop.connect_write_pipe(asyncio.Protocol, proc.stdin)
            conn = _Connection(proc, requests, answers, reader)
            conn.task = loop.create_task(self._read_answers(conn), name="stepd-fork-server-answers")
            self._conn = conn
            return conn

    @staticmethod
    async def _read_answers(conn: _Connection) -> None:
        """Hand each answer to the request of its id, until the server closes its end."""
        error: ConnectionError = ConnectionError("the stepd fork server ended")
        try:
            while line := await conn.reader.readline():
                try:
                    answer = json.loads(line)
                    future = conn.waiting.pop(answer["id"])
                except (ValueError, KeyError, TypeError) as exc:
                    error = _Nonsense(f"the stepd fork server answered nonsense ({exc}): {line[:200]!r}")
                    break
                if not future.done():
                    future.set_result(answer)
        finally:
            conn.fail(error)

    async def _ask(self, folder: Path, runtime: str) -> tuple[int, str | None, bool]:
        conn = await self._server()
        self._ids += 1
        request = {"id": self._ids, "folder": str(folder), "host": self._host, "runtime": runtime}
        answer = conn.waiting[self._ids] = asyncio.get_running_loop().create_future()
        conn.requests.write(json.dumps(request).encode() + b"\n")
        reply = await answer
        if "error" in reply:
            raise OSError(reply["error"])
        return int(reply["pid"]), reply.get("started"), bool(reply.get("shared"))

    async def start(self) -> None:
        """Start the server now, not at the first gang: its interpreter start and imports (a few
        hundred milliseconds on a busy node) are then no job's to wait for. A server that cannot
        start is the first spawn's to try again (and to fall back from)."""
        if self._disabled:
            return
        try:
            await self._server()
        except OSError as exc:
            log.warning("the stepd fork server did not start (%s); trying again at the first gang", exc)

    async def spawn(self, folder: Path,
                    runtime: str = "process") -> tuple[int, str | None, subprocess.Popen[bytes] | None, bool]:
        """Start the stepd of the attempt in `folder`: (pid, start time, the Popen if not forked,
        whether the stepd is shared: the host's). OSError when it could not be started at all."""
        if not self._disabled:
            for _ in range(2):  # a server that died (killed) is started again once
                try:
                    pid, started, shared = await self._ask(folder, runtime)
                    return pid, started, None, shared
                except OSError as exc:
                    if not isinstance(exc, ConnectionError):
                        raise
                    log.warning("the stepd fork server is gone (%s); starting it again", exc)
            if not self._disabled:
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
        hosts run on, and it exits after the last (see `stepd_host`). Requests it has not answered
        fail (ConnectionError): their callers ask the next server."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        proc = conn.proc
        conn.requests.close()  # what is written still goes; then the server reads its end
        if conn.task is not None and not conn.task.done() and proc.poll() is None:
            with contextlib.suppress(Exception):  # it closes its end once it read ours
                await asyncio.wait_for(asyncio.shield(conn.task), 5.0)
        if conn.task is not None:
            conn.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await conn.task
        conn.fail(ConnectionError("the stepd fork server was let go"))
        conn.answers.close()
        for _ in range(20):  # one holding no gang exits at once: reaped here
            if proc.poll() is not None:
                return
            await asyncio.sleep(0.01)
        _LEFT.append(proc)

    async def close(self) -> None:
        """End the server's service to this agent; its stepds and hosted gangs keep running."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            await self._discard()
        for proc in list(_LEFT):
            if proc.poll() is not None:
                _LEFT.remove(proc)


#: Servers let go while they still hosted gangs: polled (reaped) at each close.
_LEFT: list[subprocess.Popen[bytes]] = []
