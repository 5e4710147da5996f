"""Readiness of a freshly started stack: queues defaulted, nodes registered, endpoints answering.

It asks the cluster through `corral.client`, so it sits above both the client and the stack (the
client reads the stack's context and credentials files).

Why: `corral up` promises that when it prints, the cluster is usable — every declared node is in
the log, there is a queue to submit to, and every telemetry endpoint it prints answers — rather
than leaving a newcomer (or a Prometheus scrape) to race the services. A service opens its
endpoint only after connecting to Postgres and NATS, which the nodes' registration does not wait
for: on a busy machine the status could otherwise be printed before admission listens.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from corral.client import Client
from corral.contracts.queues import validate_queues
from corral.stack.context import Context
from corral.stack.up import Agents, Stack

DEFAULT_QUEUES = {"queues": [{"name": "default", "guaranteed_gpus": 0, "weight": 1.0}]}


def expected_nodes(stack: Stack) -> int:
    from corral.contracts.cluster import load_cluster_file, parse_cluster_shorthand

    if stack.options.agents is Agents.NONE:
        return 0  # the control plane only: agents on other hosts register when they start
    raw = json.loads((stack.options.data_dir / "cluster.json").read_text())
    if "shorthand" in raw:
        return len(parse_cluster_shorthand(raw["shorthand"]).nodes)
    return len(load_cluster_file(Path(raw["file"])).nodes)


async def _wait(ctx: Context, want: int, timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    client: Client | None = None
    while client is None:
        try:
            client = await Client.connect(ctx)
        except (TimeoutError, OSError, ConnectionError) as exc:
            if time.monotonic() > deadline:
                raise TimeoutError(f"services did not come up: {exc}") from exc
            await asyncio.sleep(0.2)
        except Exception as exc:  # the schema may be mid-migration by a service: retry briefly
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
            del exc
    try:
        view = await client.view()
        if not view.queues:
            await client.apply_queues(validate_queues(DEFAULT_QUEUES))
        view = await client.wait_for(
            lambda v: sum(1 for n in v.nodes.values() if not n.lost) >= want and bool(v.queues),
            max(1.0, deadline - time.monotonic()), interval=0.1)
        return [{"name": n.name, "gpus": n.gpu_count, "model": n.inventory.gpus[0].model if n.inventory.gpus else "",
                 "rack": n.inventory.rack, "lost": n.lost} for n in sorted(view.nodes.values(), key=lambda n: n.name)]
    finally:
        await client.close()


async def _answers(url: str, timeout: float) -> bool:
    """Whether an HTTP GET of `url`/healthz gets a status line (any status: the endpoint exists)."""
    parts = urlsplit(url)
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(parts.hostname, parts.port), timeout)
    except (OSError, TimeoutError):
        return False
    try:
        writer.write(f"GET /healthz HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n\r\n".encode())
        line = await asyncio.wait_for(reader.readline(), timeout)
        return line.startswith(b"HTTP/")
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()


async def silent_endpoints(endpoints: Mapping[str, str], deadline: float) -> list[str]:
    """Wait (until the monotonic `deadline`) for every endpoint (name -> base URL) to answer
    /healthz; the names of those that never did, in the given order."""
    waiting = dict(endpoints)
    while waiting:
        left = deadline - time.monotonic()
        answered = await asyncio.gather(*(_answers(url, max(0.2, min(2.0, left))) for url in waiting.values()))
        waiting = {name: url for (name, url), ok in zip(waiting.items(), answered, strict=True) if not ok}
        if not waiting or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.1)
    return [name for name in endpoints if name in waiting]


async def _ready(ctx: Context, stack: Stack, timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    nodes = await _wait(ctx, expected_nodes(stack), timeout)
    endpoints = {p.name: p.metrics_url for p in stack.processes if p.metrics_url}
    for name in await silent_endpoints(endpoints, max(deadline, time.monotonic() + 1.0)):
        process = stack.process(name)
        stack.say(f"{name}: its telemetry endpoint {process.metrics_url} does not answer yet "
                  f"(its log: {process.log_path})")
    return nodes


def wait_for_nodes(ctx: Context, stack: Stack, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Block until every declared node is registered (and a queue exists) and every process's
    telemetry endpoint answers (one that does not by `timeout` is named, not fatal: the process
    runs on without it, as `corral.telemetry.endpoint.start` says); return the nodes."""
    return asyncio.run(_ready(ctx, stack, timeout))
