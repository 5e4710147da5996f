"""Faults of the bus and of its dependencies, end to end (issue 11, items 1, 2 and 8).

Each test runs the whole stack as processes. The Postgres outage test runs its own private
Postgres: stopping the session-wide one would break every other test.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from nats.js.api import DiscardPolicy

from corral.bus import Bus
from corral.contracts.jobspec import validate_job_spec
from corral.projection import JobState
from corral.stack.servers import PostgresServer
from corral.stack.up import Stack, StackOptions
from tests.e2e.conftest import StackFactory, connect, dump_logs, with_queues

SMALL_JOB = {"name": "small", "queue": "team-a", "gpus_per_replica": 1, "runtime": "sim", "duration_seconds": 1}


@pytest.fixture
def private_postgres() -> Iterator[PostgresServer]:
    """A Postgres of this test alone, so the test may stop and restart it."""
    data = Path(tempfile.mkdtemp(prefix="corral-test-pg-private-"))
    server = PostgresServer(data).start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)


async def dead_letter_count(bus: Bus) -> int:
    info = await bus.js.stream_info(bus.names.stream("dlq"))
    return int(info.state.messages)


@pytest.fixture
async def outage_stack(tmp_path: Path, nats_url: str, namespace: str,
                       private_postgres: PostgresServer) -> AsyncIterator[Stack]:
    # The landed code gave up after max_deliver deliveries spaced by the backoff (0.5+2+10+30 s);
    # these knobs shrink that window to ~1.5 s, so an outage of a few seconds is "longer than it".
    stack = Stack(StackOptions(
        data_dir=tmp_path / "stack", cluster="1x8:H100", nats_url=nats_url, postgres_dsn=private_postgres.dsn,
        namespace=namespace, runtime="sim", placement_standby=False, write_user_context=False,
        extra_env={"CORRAL_MAX_DELIVER": "3", "CORRAL_RETRY_BACKOFF": "0.2,0.5,1", "CORRAL_LOG_LEVEL": "INFO",
                   "CORRAL_NODE_LOST_SECONDS": "60"}))
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


async def test_a_submission_made_while_postgres_is_down_is_admitted_when_it_is_back(
        outage_stack: Stack, private_postgres: PostgresServer) -> None:
    stack = outage_stack
    client = await connect(stack)
    try:
        await with_queues(client, [{"name": "team-a", "guaranteed_gpus": 8}], nodes=1)
        bus = client.bus
        private_postgres.stop()
        job = await client.submit(validate_job_spec(SMALL_JOB))  # the bus only: accepted while the log is down
        cancelled = await client.submit(validate_job_spec({**SMALL_JOB, "duration_seconds": 600}))
        await client.cancel(cancelled)
        await asyncio.sleep(8)  # far longer than the shortened give-up window
        assert await dead_letter_count(bus) == 0, "an unavailable Postgres is not bad input\n" + dump_logs(stack)
        private_postgres.start()
        for process in stack.dead():  # as `corral up` does: placement exits when it loses its lease
            process.start()
    finally:
        await client.close()
    client = await connect(stack)
    try:
        view = await client.wait_for(lambda v: job in v.jobs and v.jobs[job].state.terminal
                                     and cancelled in v.jobs and v.jobs[cancelled].state.terminal, 60)
        assert view.jobs[job].state is JobState.COMPLETED, dump_logs(stack)
        assert view.jobs[cancelled].state is JobState.CANCELLED, dump_logs(stack)
        assert await dead_letter_count(client.bus) == 0, dump_logs(stack)
    except BaseException:
        print(dump_logs(stack))
        raise
    finally:
        await client.close()


async def _settled(read: Callable[[], Awaitable[int]], quiet: float = 3.0, timeout: float = 45.0) -> int:
    """The value of `read()` once it has not changed for `quiet` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    value, since = await read(), loop.time()
    while loop.time() - since < quiet and loop.time() < deadline:
        await asyncio.sleep(0.5)
        now = await read()
        if now != value:
            value, since = now, loop.time()
    return value


async def test_streams_are_bounded_and_garbage_makes_one_dead_letter_per_message(make_stack: StackFactory) -> None:
    stack = make_stack(cluster="1x8:H100")
    client = await connect(stack)
    try:
        await with_queues(client, [{"name": "team-a", "guaranteed_gpus": 8}], nodes=1)
        bus = client.bus
        for kind in ("events", "inbox", "dlq"):
            config = (await bus.js.stream_info(bus.names.stream(kind))).config
            assert config.max_age and config.max_age > 0, kind
            assert config.max_bytes and config.max_bytes > 0, kind
            assert config.max_msg_size and config.max_msg_size > 0, kind
        dlq = (await bus.js.stream_info(bus.names.stream("dlq"))).config
        assert dlq.max_msgs and dlq.max_msgs > 0 and dlq.discard == DiscardPolicy.OLD

        # Garbage on an event subject every service reads, and on an inbox subject: each is one entry.
        n = 12
        for i in range(n):
            await bus.js.publish(bus.names.events_subject("JobSubmitted"), b"\xff garbage %d" % i,
                                 headers={"Nats-Msg-Id": f"garbage-event-{i}"})
            await bus.js.publish(bus.names.inbox_subject("JobSubmitted"), b"{not json %d" % i,
                                 headers={"Nats-Msg-Id": f"garbage-inbox-{i}"})
        letters = await _settled(lambda: dead_letter_count(bus))
        assert n <= letters <= 2 * n, f"{letters} dead letters for {2 * n} garbage messages"

        # A request on an inbox subject no service reads is refused, never kept where no one reads it.
        unknown = bus.names.inbox_subject("NoSuchRequest")
        with pytest.raises(Exception):  # noqa: B017 - "no responders" / no stream takes it
            await bus.js.publish(unknown, b"{}", timeout=2)
        inbox = await bus.js.stream_info(bus.names.stream("inbox"), subjects_filter=unknown)
        assert not (inbox.state.subjects or {}), "a message on an unknown inbox subject was stored"

        # Agent durables are named after their node set: they expire once no process uses them.
        names = [c.name for c in await bus.js.consumers_info(bus.names.stream("events"))]
        agents = [name for name in names if name.startswith("node-agent")]
        assert agents, names
        for name in agents:
            info = await bus.js.consumer_info(bus.names.stream("events"), name)
            assert info.config.inactive_threshold and info.config.inactive_threshold > 0, name
    finally:
        await client.close()
