"""Faults of the bus and of its dependencies, end to end.

Each test runs the whole stack as processes. The Postgres outage test runs its own private
Postgres: stopping the session-wide one would break every other test.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.js.api import DiscardPolicy

from corral.bus import Bus
from corral.bus.delivery import (
    DLQ_CONSUMER,
    DLQ_DELIVERIES,
    DLQ_ERROR,
    DLQ_MSG_ID,
    DLQ_SEQUENCE,
    DLQ_STREAM,
    DLQ_SUBJECT,
)
from corral.contracts import events as ev
from corral.contracts.envelope import job_stream
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.registry import encode
from corral.eventstore import EventStore
from corral.projection import JobState
from corral.services.base import to_new_event
from corral.stack.servers import PostgresServer
from corral.stack.up import Stack, StackOptions
from tests.e2e.conftest import StackFactory, connect, dump_logs, handled, with_queues
from tests.e2e.test_cli import as_json, corral

#: The give-up window of `outage_stack`'s knobs: 3 deliveries, 0.2 s then 0.5 s apart, and handling.
GIVE_UP = 1.0
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
    # A consumer that counted failures while Postgres is down would give up after max_deliver
    # deliveries spaced by the backoff; these knobs shrink that window to GIVE_UP, so an outage of a
    # few seconds is "longer than it".
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
        await _held(bus, "admission-inbox")
        await asyncio.sleep(3 * GIVE_UP)  # from the first delivery: a consumer counting failures gives up in it
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


async def _held(bus: Bus, durable: str, timeout: float = 30.0) -> None:
    """Returns once the inbox consumer `durable` has taken a request it has not acknowledged yet."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (await bus.js.consumer_info(bus.names.stream("inbox"), durable)).num_ack_pending:
        assert loop.time() < deadline, f"{durable} took no request in {timeout} s"
        await asyncio.sleep(0.05)


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
        await handled(bus)  # every consumer took every garbage message: the dead letters are all written
        letters = await dead_letter_count(bus)
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


def blob_spec(size: int, name: str = "blob") -> object:
    return validate_job_spec({**SMALL_JOB, "name": name, "env": {"BLOB": "x" * size}})


async def test_an_oversized_submission_is_refused_and_an_oversized_event_does_not_stop_the_relay(
        make_stack: StackFactory) -> None:
    stack = make_stack(cluster="1x8:H100")
    client = await connect(stack)
    try:
        await with_queues(client, [{"name": "team-a", "guaranteed_gpus": 8}], nodes=1)
        # The client refuses before publishing, naming the size, the limit and the fix.
        with pytest.raises(ValueError, match=r"(?s)bytes.*limit.*CORRAL_MAX_SPEC_BYTES"):
            await client.submit(blob_spec(300_000))  # type: ignore[arg-type]

        # A pipeline that publishes to the inbox itself gets a JobRejected saying the same.
        raw = ev.JobSubmitted.new(stream=job_stream("jraw"), actor="user/pipe", job_id="jraw",
                                  spec=blob_spec(300_000), user="pipe")  # type: ignore[arg-type]
        await client.bus.publish(client.bus.names.inbox_subject("JobSubmitted"), encode(raw), raw.event_id)
        view = await client.wait_for(lambda v: "jraw" in v.jobs and v.jobs["jraw"].state.terminal, 30)
        job = view.jobs["jraw"]
        assert job.state is JobState.REJECTED and job.reason is not None, dump_logs(stack)
        assert job.reason.code == "SPEC_TOO_LARGE"
        assert "300," in job.reason.message and "limit" in job.reason.message, job.reason.message
        trail = [type(e).__name__ for _, e in await client.job_events("jraw")]
        assert trail == ["JobRejected"], "the oversized submission itself is never recorded"

        # An event in the log larger than the bus takes (NATS max payload: 8 MiB) is skipped with an
        # alert, and the relay keeps relaying: a later job runs to the end.
        huge = ev.JobSubmitted.new(stream=job_stream("jhuge"), actor="user/pipe", job_id="jhuge",
                                   spec=blob_spec(8_400_000, "huge"), user="pipe")  # type: ignore[arg-type]
        # written as a service would (the CLI's login only reads)
        async with await EventStore.open(stack.process("admission").env["CORRAL_POSTGRES_DSN"], pool_size=1) as store:
            await store.append(huge.stream, 0, [to_new_event(huge)])
        later = await client.submit(validate_job_spec(SMALL_JOB))
        view = await client.wait_for(lambda v: later in v.jobs and v.jobs[later].state.terminal, 60)
        assert view.jobs[later].state is JobState.COMPLETED, dump_logs(stack)
        alerts = [(s, e) for s, e in await client.events(types=["EventNotRelayed"])]
        assert len(alerts) == 1, dump_logs(stack)
        stored, alert = alerts[0]
        assert stored.stream == "cluster"
        huge_position = (await client.store.read_stream(huge.stream))[0].position
        assert alert.position == huge_position and alert.event_type == "JobSubmitted"
        assert alert.size > 8 * 1024 * 1024
    finally:
        await client.close()


async def test_dead_letters_are_listed_and_a_replayed_submission_is_admitted(make_stack: StackFactory) -> None:
    stack = make_stack(cluster="1x8:H100")
    client = await connect(stack)
    try:
        await with_queues(client, [{"name": "team-a", "guaranteed_gpus": 8}], nodes=1)
        bus = client.bus
        # A valid submission dead-lettered as the landed code did during a Postgres outage.
        lost = ev.JobSubmitted.new(stream=job_stream("jlost"), actor="user/ann", job_id="jlost",
                                   spec=validate_job_spec(SMALL_JOB), user="ann")
        inbox = bus.names.inbox_subject("JobSubmitted")
        await bus.publish(bus.names.dead_letter_subject(bus.names.stream("inbox"), 7), encode(lost), "dlq:lost",
                          {DLQ_SUBJECT: inbox, DLQ_STREAM: bus.names.stream("inbox"), DLQ_SEQUENCE: "7",
                           DLQ_CONSUMER: "admission-inbox", DLQ_DELIVERIES: "5", DLQ_MSG_ID: "replay-of-lost",
                           DLQ_ERROR: "failed 5 times; last: ConnectionRefusedError"})
        # And a garbage request, dead-lettered by admission for real.
        await bus.js.publish(inbox, b"{garbage")
        await handled(bus)
        listed = as_json(corral(stack, "dlq", "list", "--json"))
        assert len(listed) == 2, listed
        by_consumer = {row["consumer"]: row for row in listed}
        assert by_consumer["admission-inbox"]["deliveries"] in (1, 5)
        assert {row["subject"] for row in listed} == {inbox}
        assert any("ConnectionRefusedError" in row["error"] for row in listed)
        assert any("undecodable" in row["error"] for row in listed), listed
        table = corral(stack, "dlq", "list").stdout
        assert "SEQ" in table and "CONSUMER" in table and "admission-inbox" in table

        replayed_seq = next(row["seq"] for row in listed if "ConnectionRefusedError" in row["error"])
        out = corral(stack, "dlq", "replay", str(replayed_seq)).stdout
        assert "replayed" in out
        view = await client.wait_for(lambda v: "jlost" in v.jobs and v.jobs["jlost"].state.terminal, 60)
        assert view.jobs["jlost"].state is JobState.COMPLETED, dump_logs(stack)
        remaining = as_json(corral(stack, "dlq", "list", "--json"))
        assert [row["seq"] for row in remaining] == [r["seq"] for r in listed if r["seq"] != replayed_seq]
        missing = corral(stack, "dlq", "replay", "999999", check=False)
        assert missing.returncode == 1 and "no dead letter 999999" in missing.stdout
    finally:
        await client.close()
