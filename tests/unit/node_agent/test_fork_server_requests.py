"""The agent's requests to the stepd fork server are pipelined: a start does not wait for the
answers to the starts before it, and each answer goes to its own request.

A stand-in server (a script run in place of the interpreter) reads several requests before it
answers any, and answers them in reverse: one request at a time would wait for an answer that
never comes.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

from corral.services.node_agent.process.fork_server import ForkServer


def stand_in(tmp_path: Path, body: str) -> str:
    """An executable that ignores its arguments (`-m ...zygote`) and runs `body` instead."""
    server = tmp_path / "server.py"
    server.write_text(textwrap.dedent(body))
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {server}\n")
    python.chmod(0o755)
    return str(python)


READS_THREE_THEN_ANSWERS = """
    import json, sys
    lines = [sys.stdin.readline() for _ in range(3)]
    for line in reversed(lines):
        request = json.loads(line)
        answer = {"id": request["id"], "pid": 1000 + len(request["folder"]), "started": "1", "shared": False}
        sys.stdout.write(json.dumps(answer) + "\\n")
    sys.stdout.flush()
    sys.stdin.read()
"""


async def test_three_starts_are_asked_at_once_and_each_gets_its_own_answer(tmp_path: Path) -> None:
    server = ForkServer(stand_in(tmp_path, READS_THREE_THEN_ANSWERS), {"PATH": "/usr/bin:/bin"})
    folders = [tmp_path / ("a" * n) for n in (1, 2, 3)]
    try:
        answers = await asyncio.wait_for(asyncio.gather(*(server.spawn(f) for f in folders)), 20)
    finally:
        await server.close()
    assert [(pid, started, proc, shared) for pid, started, proc, shared in answers] == [
        (1000 + len(str(f)), "1", None, False) for f in folders]


DIES_ONCE_WITH_REQUESTS_UNANSWERED = """
    import json, os, sys
    marker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "died")
    first = not os.path.exists(marker)
    lines = [sys.stdin.readline() for _ in range(2)]
    if first:
        open(marker, "w").close()
        os._exit(1)
    for line in lines:
        request = json.loads(line)
        sys.stdout.write(json.dumps({"id": request["id"], "pid": 7, "started": "1", "shared": True}) + "\\n")
    sys.stdout.flush()
    sys.stdin.read()
"""


async def test_requests_a_dead_server_left_unanswered_are_asked_of_the_next(tmp_path: Path) -> None:
    server = ForkServer(stand_in(tmp_path, DIES_ONCE_WITH_REQUESTS_UNANSWERED), {"PATH": "/usr/bin:/bin"})
    try:
        answers = await asyncio.wait_for(
            asyncio.gather(server.spawn(tmp_path / "x"), server.spawn(tmp_path / "y")), 20)
    finally:
        await server.close()
    assert (tmp_path / "died").exists()
    assert answers == [(7, "1", None, True), (7, "1", None, True)]


ANSWERS_EACH = """
    import json, sys
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.write(json.dumps({"id": request["id"], "pid": 9, "started": "1", "shared": True}) + "\\n")
        sys.stdout.flush()
"""


async def test_a_server_started_ahead_is_the_one_the_first_start_asks(tmp_path: Path) -> None:
    # started with the agent: its interpreter start is no job's to wait for
    server = ForkServer(stand_in(tmp_path, ANSWERS_EACH), {"PATH": "/usr/bin:/bin"})
    try:
        await server.start()
        running = server.pid
        assert running is not None
        assert await asyncio.wait_for(server.spawn(tmp_path / "x"), 20) == (9, "1", None, True)
        assert server.pid == running
    finally:
        await server.close()


async def test_a_server_that_cannot_start_ahead_is_left_to_the_first_start(tmp_path: Path) -> None:
    server = ForkServer(str(tmp_path / "no-such-python"), {"PATH": "/usr/bin:/bin"})
    await server.start()  # logged, not raised: the agent runs on
    assert server.pid is None
    await server.close()
