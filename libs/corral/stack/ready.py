"""Readiness of a freshly started stack: queues defaulted, nodes registered.

Why: `corral up` promises that when it prints, the cluster is usable — every declared node is in
the log and there is a queue to submit to — rather than leaving a newcomer to race the services.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

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


def wait_for_nodes(ctx: Context, stack: Stack, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Block until every declared node is registered (and a queue exists); return the nodes."""
    return asyncio.run(_wait(ctx, expected_nodes(stack), timeout))
