"""End-to-end fixtures: the whole system as separate processes, on the test's own servers.

Each test gets `corral up`'s stack (admission, quota, placement + standby, preemption, node
agents) as real OS processes against a fresh database and NATS namespace, and a `Client` to drive
it the way a pipeline or the CLI does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from corral.bus import Bus
from corral.client import Client
from corral.contracts.queues import validate_queues
from corral.stack.context import Context
from corral.stack.up import Agents, Stack, StackOptions


@dataclass
class Cluster:
    stack: Stack
    client: Client
    data_dir: Path
    extra: dict[str, object] = field(default_factory=dict)


StackFactory = Callable[..., Stack]

#: The agents' workers outlive a graceful stop (an upgrade); a test's stack must not leave any, also
#: when its last test's cancel has not reached the agent yet as the stack stops.
STOP_WORKERS = {"CORRAL_AGENT_STOP_WORKERS_ON_EXIT": "1"}


@pytest.fixture
def make_stack(tmp_path: Path, nats_url: str, postgres_dsn: str, namespace: str) -> Iterator[StackFactory]:
    stacks: list[Stack] = []

    def make(cluster: str = "4x8:H100", runtime: str = "sim", env: dict[str, str] | None = None,
             cluster_file: Path | None = None, agents: Agents = Agents.SIMULATED) -> Stack:
        stack = Stack(StackOptions(
            data_dir=tmp_path / f"stack{len(stacks)}", cluster=cluster, cluster_file=cluster_file, agents=agents,
            nats_url=nats_url, postgres_dsn=postgres_dsn, namespace=namespace, runtime=runtime,
            write_user_context=False,
            extra_env={"CORRAL_NODE_LOST_SECONDS": "6", "CORRAL_LOG_LEVEL": "INFO", **STOP_WORKERS, **(env or {})}))
        stack.start()
        stacks.append(stack)
        return stack

    yield make
    for s in stacks:
        s.stop()


async def connect(stack: Stack) -> Client:
    assert stack.context is not None
    return await Client.connect(stack.context)


async def with_queues(client: Client, queues: list[dict[str, object]], nodes: int, timeout: float = 30) -> None:
    await client.apply_queues(validate_queues({"queues": queues}))
    names = {str(q["name"]) for q in queues}
    await client.wait_for(lambda v: names <= set(v.queues) and
                          sum(1 for n in v.nodes.values() if not n.lost) >= nodes, timeout)


@pytest.fixture
async def cluster(make_stack: StackFactory) -> AsyncIterator[Cluster]:
    """The default stack: 4 nodes x 8 GPUs, sim runtime, queues team-a and team-b (16 each)."""
    stack = make_stack()
    client = await connect(stack)
    try:
        await with_queues(client, [{"name": "team-a", "guaranteed_gpus": 16, "max_gpus": 32},
                                   {"name": "team-b", "guaranteed_gpus": 16, "max_gpus": 32}], nodes=4)
        yield Cluster(stack=stack, client=client, data_dir=stack.options.data_dir)
    finally:
        await client.close()


async def handled(bus: Bus, kinds: tuple[str, ...] = ("inbox", "events"), timeout: float = 30.0) -> None:
    """Returns once every durable consumer of the `kinds` streams (each service's, each agent's) has
    taken and acknowledged every message it reads there: what was published before this call is
    handled, and so are the events that handling published. Waits on the server's count, not on a
    clock: a test asserting that a message changed nothing asserts after its consumers are done."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        busy = [f"{info.name}: {info.num_pending} not taken, {info.num_ack_pending} not acknowledged"
                for kind in kinds for info in await bus.js.consumers_info(bus.names.stream(kind))
                if info.config.durable_name and not info.name.endswith("-history")
                and (info.num_pending or info.num_ack_pending)]
        if not busy:
            return
        if loop.time() > deadline:
            raise AssertionError(f"consumers still busy after {timeout} s: {busy}")
        await asyncio.sleep(0.05)


def with_database(dsn: str, database: str) -> str:
    return dsn.rpartition("/")[0] + "/" + database


@contextlib.asynccontextmanager
async def own_site(postgres_server_dsn: str, prefix: str, *, data_mode: int | None = None,
                   env: dict[str, str] | None = None, **options: Any) -> AsyncIterator[Stack]:
    """`corral up` as an operator runs it (its own NATS, with identities and TLS) on a database of
    its own: 2 nodes x 8 GPUs, queue team-a (16 GPUs). `options` go to StackOptions, `env` to every
    process it starts; `data_mode` is the data folder's mode (mkdtemp's 0700 keeps every other
    account out)."""
    name = f"t_{secrets.token_hex(6)}"
    owner = await asyncpg.connect(with_database(postgres_server_dsn, "postgres"))
    try:
        await owner.execute(f'CREATE DATABASE "{name}"')
    finally:
        await owner.close()
    data = Path(tempfile.mkdtemp(prefix=prefix))
    if data_mode is not None:
        os.chmod(data, data_mode)
    stack = Stack(StackOptions(data_dir=data, cluster="2x8:H100", postgres_dsn=with_database(postgres_server_dsn, name),
                               namespace="corral", **options,
                               extra_env={"CORRAL_LOG_LEVEL": "INFO", **STOP_WORKERS, **(env or {})}))
    stack.start()
    try:
        async with await Client.connect(stack.context) as client:  # type: ignore[arg-type]
            await client.apply_queues(validate_queues({"queues": [{"name": "team-a", "guaranteed_gpus": 16}]}))
            await client.wait_for(lambda v: "team-a" in v.queues and len(v.nodes) >= 2, 30)
        yield stack
    finally:
        stack.stop()
        shutil.rmtree(data, ignore_errors=True)


def dump_logs(stack: Stack, lines: int | None = 40, others: dict[str, Path] | None = None) -> str:
    """The last `lines` lines (None: all) of every service's log, of each of `others` (a name and
    its log file: a nats-server's) and of every worker rank's output (a job that failed says why
    only in its ranks' logs)."""

    def tail(path: Path, keep: int | None) -> str:
        kept = path.read_text(errors="replace").splitlines()
        return "\n".join(kept if keep is None else kept[-keep:])

    out = []
    named = [(p.name, p.log_path) for p in stack.processes] + list((others or {}).items())
    for name, path in named:
        try:
            out.append(f"==== {name}\n" + tail(path, lines))
        except OSError:
            pass
    if stack.context is None:
        return "\n".join(out)
    for rank_log in sorted((Path(stack.context.log_dir) / "workers").glob("*/rank-*.log")):
        try:
            text = tail(rank_log, None if lines is None else 25)
        except OSError:
            continue
        out.append(f"==== worker {rank_log.parent.name} {rank_log.stem}\n{text}")
    return "\n".join(out)


__all__ = ["Cluster", "Context", "connect", "dump_logs", "handled", "with_queues"]
