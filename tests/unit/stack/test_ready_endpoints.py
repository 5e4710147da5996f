"""`corral up` prints each process's telemetry endpoint only once it answers.

Readiness that waits only for the nodes and a queue (which placement and the agents provide) can
print admission's endpoint before admission opens it (after connecting to Postgres and NATS), and
on a busy machine a GET of its /healthz is then refused. These tests hold the wait that closes
that race against real sockets.
"""

from __future__ import annotations

import asyncio
import socket
import time

from corral.cluster_ready import silent_endpoints


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _serve_after(port: int, delay: float, status: int = 200) -> asyncio.Server:
    await asyncio.sleep(delay)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n".encode())
        await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", port)


def test_waits_for_an_endpoint_that_starts_listening_late() -> None:
    async def scenario() -> tuple[list[str], float]:
        port = _free_port()
        late = asyncio.create_task(_serve_after(port, 0.6))
        began = time.monotonic()
        silent = await silent_endpoints({"admission": f"http://127.0.0.1:{port}"}, time.monotonic() + 10)
        took = time.monotonic() - began
        (await late).close()
        return silent, took

    silent, took = asyncio.run(scenario())
    assert silent == [] and took >= 0.5


def test_names_an_endpoint_that_never_answers_once_the_deadline_passes() -> None:
    async def scenario() -> tuple[list[str], float]:
        up, never = _free_port(), _free_port()
        server = await _serve_after(up, 0)
        began = time.monotonic()
        silent = await silent_endpoints({"quota": f"http://127.0.0.1:{up}", "admission": f"http://127.0.0.1:{never}"},
                                        time.monotonic() + 0.8)
        server.close()
        return silent, time.monotonic() - began

    silent, took = asyncio.run(scenario())
    assert silent == ["admission"] and took < 5


def test_a_stopping_process_answering_503_still_counts_as_listening() -> None:
    """The wait is for the endpoint printed to exist; what /healthz says is the process's to tell."""
    async def scenario() -> list[str]:
        port = _free_port()
        server = await _serve_after(port, 0, status=503)
        silent = await silent_endpoints({"preemption": f"http://127.0.0.1:{port}"}, time.monotonic() + 5)
        server.close()
        return silent

    assert asyncio.run(scenario()) == []
