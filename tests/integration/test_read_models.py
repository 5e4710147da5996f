"""The read model on real Postgres: the projector's stored view plus the log's tail says what the
whole log says, for the whole cluster, one job or one page of a listing; a view of other code, or
past the log's head, is never read; only the services' role may write it."""

from __future__ import annotations

from datetime import timedelta

import asyncpg
import pytest

from corral.client import Client
from corral.contracts.envelope import Event
from corral.contracts.registry import encode
from corral.eventstore import ANY, EventStore, NewEvent
from corral.projection import ClusterView
from corral.readmodel import codec, snapshots
from corral.readmodel.pages import JobFilter, page_of
from corral.readmodel.projector import Projector
from corral.readmodel.snapshots import (
    FINISHED,
    StoredViewChanged,
    forget_other_schemas,
    read_job,
    read_nodes,
    read_page,
    read_view,
)
from corral.stack.context import Context
from tests.unit.readmodel_logs import varied_log


async def append(store: EventStore, events: list[Event]) -> None:
    for e in events:
        await store.append(e.stream, ANY, [NewEvent(
            event_id=e.event_id, stream=e.stream, type=e.type, schema_version=e.schema_version, data=encode(e),
            correlation_id=e.correlation_id, causation_id=e.causation_id, occurred_at=e.occurred_at)])


def whole(events: list[Event]) -> ClusterView:
    view = ClusterView()
    for position, event in enumerate(events, 1):
        view.apply(event, None, position)
    return view


def assert_same_now(view: ClusterView, truth: ClusterView) -> None:
    assert view.active.keys() == truth.active.keys()
    for job_id, job in view.jobs.items():
        assert job == truth.jobs[job_id], job_id
    assert view.nodes == truth.nodes and view.queues == truth.queues and view.ports == truth.ports
    assert view.position == truth.position


async def test_stored_view_plus_tail_answers_as_the_whole_log(postgres_dsn: str) -> None:
    log = varied_log(40, seed=7)
    store = await EventStore.open(postgres_dsn)
    try:
        cut = 2 * len(log) // 3
        await append(store, log[:cut])
        projector = Projector(store, every_events=40, batch=40, every_seconds=3600)
        await projector.resume()
        await projector.catch_up()  # several writes: finished jobs stored and dropped on the way
        assert set(projector.view.jobs) == set(projector.view.active), "the projector keeps only active jobs"
        await append(store, log[cut:])  # the tail, appended after the last snapshot
        truth = whole(log)

        assert_same_now(await read_view(store), truth)
        nodes = await read_nodes(store)  # `corral nodes`: the fenced jobs and the tail's, no other
        assert nodes.nodes == truth.nodes and nodes.releasing_gpus() == truth.releasing_gpus()
        everything = await read_view(store, states=FINISHED)
        assert everything.jobs.keys() == truth.jobs.keys()
        assert_same_now(everything, truth)
        finished = next(j for j in truth.jobs if j not in truth.active)
        assert (await read_view(store, job_ids=[finished])).jobs[finished] == truth.jobs[finished]

        again = Projector(store)  # a restart resumes from the stored view and stores the tail
        await again.resume()
        await again.catch_up()
        assert_same_now(again.view, truth)
        async with store.connection() as conn:
            assert await conn.fetchval("SELECT position FROM view_snapshots") == len(log)

            # Never trusted past the log: a snapshot ahead of the head is ignored (the log is folded),
            # and a projector deletes it with its jobs (here a job the restored log never had).
            await conn.execute("UPDATE view_snapshots SET position = position + 1000")
            await conn.execute("INSERT INTO view_jobs SELECT schema, 'ghost', position, state, submitted_at, data"
                               " FROM view_jobs LIMIT 1")
        assert_same_now(await read_view(store), truth)
        assert_same_now(await read_view(store, schema="other-code"), truth)  # nothing of that schema
        restored = Projector(store)
        await restored.resume()
        await restored.catch_up()
        assert (await read_view(store, states=FINISHED)).jobs.keys() == truth.jobs.keys()
        async with store.connection() as conn:
            assert await conn.fetchval("SELECT position FROM view_snapshots") == len(log)
    finally:
        await store.close()


PAGES = (JobFilter(), JobFilter(all_jobs=True), JobFilter(states={"COMPLETED", "PENDING"}),
         JobFilter(queue="q", user="alice"), JobFilter(queue="q/x"), JobFilter(user="bob", all_jobs=True))


async def test_one_job_and_one_page_read_their_rows_and_say_what_the_whole_log_says(
        postgres_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    log = varied_log(40, seed=11)
    store = await EventStore.open(postgres_dsn)
    try:
        cut = len(log) // 2
        await append(store, log[:cut])
        truth = whole(log[:cut])
        for where in PAGES:  # no stored view yet: the log is folded
            assert await read_page(store, where, 5) == page_of(truth.jobs.values(), where, 5)
        projector = Projector(store, every_events=40, batch=40, every_seconds=3600)
        await projector.resume()
        await projector.catch_up()
        await append(store, log[cut:])  # a tail that moves jobs into and out of every page
        truth = whole(log)
        touched = {j for e in log[cut:] for j in codec.touched_jobs(e)}

        decoded: list[bytes] = []

        def counted(data: bytes) -> object:
            decoded.append(data)
            return codec.decode_job(data)

        monkeypatch.setattr(snapshots, "decode_job", counted)
        for job_id in sorted(truth.jobs)[::2]:
            decoded.clear()
            assert await read_job(store, job_id) == truth.jobs[job_id], job_id
            assert len(decoded) <= 1 + len(touched)  # its row and the tail's jobs, not every active one
        assert await read_job(store, "no-such-job") is None
        client = Client(Context(nats_url="nats://unused", postgres_dsn=postgres_dsn, namespace="corral"), store, None)
        assert all([await client.knows_job(j) for j in truth.jobs]) and not await client.knows_job("no-such-job")
        for where in PAGES:
            for limit in (None, 0, 1, 3, 10):
                decoded.clear()
                expected = page_of(truth.jobs.values(), where, limit)
                assert await read_page(store, where, limit) == expected, (where, limit)
                if limit is not None:
                    assert len(decoded) <= 2 * (limit + len(touched))
    finally:
        await store.close()


async def test_two_projectors_never_mix_their_views_and_old_code_is_forgotten(postgres_dsn: str) -> None:
    log = varied_log(20, seed=3)
    store = await EventStore.open(postgres_dsn)
    try:
        third = len(log) // 3
        await append(store, log[:third])
        first, second = Projector(store, every_events=20, batch=20), Projector(store, every_events=20, batch=20)
        await first.resume()
        await first.catch_up()
        await second.resume()
        await append(store, log[third:2 * third])
        await first.catch_up()  # moves the stored view on
        with pytest.raises(StoredViewChanged):
            await second.catch_up()  # writes only over the view it read: starts again instead
        await second.resume()
        await second.catch_up()

        # Another code's view, not rewritten for an hour, is deleted with its jobs; a projector
        # whose own view was deleted starts again from the log.
        async with store.connection() as conn:
            await conn.execute("INSERT INTO view_snapshots (schema, position, data, written_at)"
                               " VALUES ('old-code', 1, '', now() - interval '2 hours')")
            await conn.execute("INSERT INTO view_jobs (schema, job_id, position, state, data)"
                               " VALUES ('old-code', 'j', 1, 'COMPLETED', '')")
        assert await forget_other_schemas(store) == 1
        assert await forget_other_schemas(store, "old-code", idle=timedelta(0)) == 1  # as other code sees it
        await append(store, log[2 * third:])
        with pytest.raises(StoredViewChanged):
            await second.catch_up()
        await second.resume()
        await second.catch_up()
        truth = whole(log)
        assert_same_now(await read_view(store), truth)
        assert (await read_view(store, states=FINISHED)).jobs.keys() == truth.jobs.keys()
        async with store.connection() as conn:
            assert await conn.fetchval("SELECT count(*) FROM view_jobs WHERE schema = 'old-code'") == 0
    finally:
        await store.close()


async def test_only_the_services_role_writes_the_read_model(postgres_dsn: str) -> None:
    store = await EventStore.open(postgres_dsn)
    await store.close()
    conn = await asyncpg.connect(postgres_dsn)
    try:
        await conn.execute("SET ROLE corral_service")
        await conn.execute("INSERT INTO view_snapshots (schema, position, data) VALUES ('s', 0, '')")
        await conn.execute("INSERT INTO view_jobs (schema, job_id, position, state, data) VALUES ('s', 'j', 0, "
                           "'COMPLETED', '')")
        await conn.execute("DELETE FROM view_jobs WHERE schema = 's'")
        await conn.execute("SET ROLE corral_reader")
        assert await conn.fetchval("SELECT count(*) FROM view_snapshots") == 1
        for sql in ("UPDATE view_snapshots SET position = 1", "INSERT INTO view_jobs (schema, job_id, position, "
                    "state, data) VALUES ('s', 'k', 0, 'COMPLETED', '')", "DELETE FROM view_snapshots"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(sql)
    finally:
        await conn.close()
