"""The blocking reader (`corral.eventstore.wire`, what `corral jobs|show|submit|cancel` read with)
on real Postgres: the read model, a job's stream, the verdict's reads and the index of submissions
answer as they do through asyncpg, and Postgres' refusals are its errors."""

from __future__ import annotations

import pytest

from corral.eventstore import EventStore, wire
from corral.projection import JobState
from corral.readmodel.projector import Projector
from corral.readmodel.snapshots import FINISHED, read_job, read_page, read_view
from tests.integration.test_read_models import PAGES, append
from tests.unit.readmodel_logs import varied_log


async def test_the_blocking_reader_answers_as_asyncpg_does(postgres_dsn: str) -> None:
    log = varied_log(30, seed=5)
    store = await EventStore.open(postgres_dsn)
    blocking = EventStore.blocking(postgres_dsn)
    assert blocking is not None
    try:
        cut = len(log) // 2
        await append(store, log[:cut])
        projector = Projector(store, every_events=30, batch=30, every_seconds=3600)
        await projector.resume()
        await projector.catch_up()
        await append(store, log[cut:])  # a tail after the stored view
        jobs = sorted({e.job_id for e in log if hasattr(e, "job_id")})

        for where in PAGES:
            for limit in (None, 0, 3):
                assert wire.finish(read_page(blocking, where, limit)) == await read_page(store, where, limit)
        for job_id in [*jobs[::3], "no-such-job"]:
            assert wire.finish(read_job(blocking, job_id)) == await read_job(store, job_id)
            stream = f"job-{job_id}"
            assert wire.finish(blocking.read_stream(stream)) == await store.read_stream(stream)
            assert wire.finish(blocking.stream_exists(stream)) == await store.stream_exists(stream)
        mine, theirs = wire.finish(read_view(blocking, states=FINISHED)), await read_view(store, states=FINISHED)
        assert mine.jobs == theirs.jobs and mine.nodes == theirs.nodes and mine.position == theirs.position
        assert any(j.state is JobState.COMPLETED for j in mine.jobs.values())
        assert wire.finish(blocking.head_position()) == await store.head_position()
        assert wire.finish(blocking.was_processed("admission", "nothing")) is False
        assert wire.finish(blocking.job_of_submission("alice", "none")) is None
        assert wire.finish(blocking.read_all(0, 7)) == await store.read_all(0, 7)
    finally:
        wire.finish(blocking.close())
        await store.close()


async def test_a_statement_postgres_refuses_is_its_error_and_the_connection_goes_on(postgres_dsn: str) -> None:
    store = await EventStore.open(postgres_dsn)  # the migrations
    await store.close()
    conn = wire.Connection.open(postgres_dsn)
    try:
        with pytest.raises(wire.PostgresError) as refused:
            wire.finish(conn.fetch("SELECT no_such_column FROM events"))
        assert refused.value.sqlstate == "42703"

        async def in_a_transaction() -> int:
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                return int(await conn.fetchval("SELECT count(*) FROM events WHERE stream = ANY($1::text[])",
                                               ['a "quoted", one', "b\\c"]))

        assert wire.finish(in_a_transaction()) == 0
        with pytest.raises(wire.PostgresError):  # read only
            wire.finish(_write_in_read_only(conn))
    finally:
        conn.close()


async def _write_in_read_only(conn: wire.Connection) -> None:
    async with conn.transaction(readonly=True):
        await conn.execute("INSERT INTO consumer_checkpoints (consumer, position) VALUES ($1, $2)", "x", 1)


def test_a_server_that_is_not_there_is_an_os_error() -> None:
    with pytest.raises(OSError):
        wire.Connection.open("postgresql://nobody@127.0.0.1:9/corral?connect_timeout=2")


async def test_a_pause_ends_when_an_append_is_committed(postgres_dsn: str) -> None:
    import time

    from corral.eventstore.wakeups import CHANNEL

    store = await EventStore.open(postgres_dsn)
    blocking = EventStore.blocking(postgres_dsn)
    assert blocking is not None
    try:
        assert blocking._pool.channel == CHANNEL
        began = time.monotonic()
        wire.finish(blocking.pause(0.2))  # listens from here; nothing appended: the whole pause
        assert time.monotonic() - began >= 0.19
        await append(store, varied_log(1)[:1])
        began = time.monotonic()
        wire.finish(blocking.pause(30))  # the append's NOTIFY is waiting: ends at once
        assert time.monotonic() - began < 5
        assert wire.finish(blocking.head_position()) == 1  # and the connection reads on
    finally:
        wire.finish(blocking.close())
        await store.close()


async def test_an_append_after_listen_and_before_the_first_pause_ends_it(postgres_dsn: str) -> None:
    """A verdict's reader listens before its first look: a verdict committed during that look
    (before any pause) wakes the pause after it, which would otherwise last its whole time."""
    import time

    store = await EventStore.open(postgres_dsn)
    blocking = EventStore.blocking(postgres_dsn)
    assert blocking is not None
    try:
        wire.finish(blocking.listen())
        assert wire.finish(blocking.head_position()) == 0  # the first look: nothing yet
        await append(store, varied_log(1)[:1])  # recorded after the look, before the pause
        began = time.monotonic()
        wire.finish(blocking.pause(30))
        assert time.monotonic() - began < 5
    finally:
        wire.finish(blocking.close())
        await store.close()
