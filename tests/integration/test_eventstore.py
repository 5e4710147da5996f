"""The Postgres event store against a real Postgres: concurrency, atomicity, immutability, order."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest

from corral.eventstore import (
    ANY,
    AlreadyProcessed,
    ConcurrencyError,
    DuplicateEvent,
    EventStore,
    InvalidEventData,
    NewEvent,
    StoredEvent,
    Tracking,
)


def event(stream: str, type: str = "Thing", **data: object) -> NewEvent:
    return NewEvent(event_id=str(uuid.uuid4()), stream=stream, type=type, schema_version=1,
                    data=json.dumps(data).encode(), correlation_id="job-1", causation_id=None,
                    occurred_at=datetime.now(UTC))


@pytest.fixture
async def store(postgres_dsn: str) -> AsyncIterator[EventStore]:
    s = await EventStore.open(postgres_dsn, pool_size=10, poll_interval=0.5)
    try:
        yield s
    finally:
        await s.close()


async def test_appends_number_versions_from_one_and_keep_data_byte_for_byte(store: EventStore) -> None:
    first = NewEvent(event_id="e1", stream="job-1", type="JobSubmitted", schema_version=2,
                     data=b'{"b": 1,  "a": [1, 2]}', correlation_id="job-1", causation_id="x",
                     occurred_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    assert await store.append("job-1", 0, [first]) == 1
    assert await store.append("job-1", 1, [event("job-1"), event("job-1")]) == 3
    stored = await store.read_stream("job-1")
    assert [e.version for e in stored] == [1, 2, 3]
    assert [e.position for e in stored] == [1, 2, 3]
    head = stored[0]
    assert (head.event_id, head.type, head.schema_version, head.data, head.correlation_id,
            head.causation_id, head.occurred_at) == (
        "e1", "JobSubmitted", 2, b'{"b": 1,  "a": [1, 2]}', "job-1", "x", first.occurred_at)
    assert await store.stream_version("job-1") == 3
    assert await store.stream_version("job-404") == 0
    assert [e.version for e in await store.read_stream("job-1", from_version=2)] == [2, 3]


async def test_stale_expected_version_is_rejected_and_writes_nothing(store: EventStore) -> None:
    await store.append("job-1", 0, [event("job-1")])
    with pytest.raises(ConcurrencyError) as caught:
        await store.append("job-1", 0, [event("job-1"), event("job-1")])
    assert (caught.value.stream, caught.value.expected, caught.value.actual) == ("job-1", 0, 1)
    assert await store.stream_version("job-1") == 1
    assert await store.head_position() == 1
    assert await store.append("job-1", ANY, [event("job-1")]) == 2


async def test_multi_stream_conflict_on_one_stream_writes_nothing_to_any(store: EventStore) -> None:
    await store.append("quota-a", 0, [event("quota-a")])
    with pytest.raises(ConcurrencyError) as caught:
        await store.append_multi({
            "job-1": (0, [event("job-1")]),
            "quota-a": (0, [event("quota-a")]),  # stale: it holds 1
            "node-n1": (0, [event("node-n1")]),
        })
    assert (caught.value.stream, caught.value.expected, caught.value.actual) == ("quota-a", 0, 1)
    assert await store.read_stream("job-1") == []
    assert await store.read_stream("node-n1") == []
    assert len(await store.read_all()) == 1
    assert await store.head_position() == 1


async def test_multi_stream_append_commits_all_streams_with_contiguous_positions(store: EventStore) -> None:
    await store.append("quota-a", 0, [event("quota-a")])
    versions = await store.append_multi({
        "job-1": (0, [event("job-1"), event("job-1")]),
        "quota-a": (1, [event("quota-a")]),
        "queue-q": (0, []),  # only asserts the version
    })
    assert versions == {"job-1": 2, "quota-a": 2, "queue-q": 0}
    assert [e.position for e in await store.read_all()] == [1, 2, 3, 4]
    with pytest.raises(ConcurrencyError):
        await store.append_multi({"queue-q": (3, []), "job-1": (2, [event("job-1")])})
    assert await store.stream_version("job-1") == 2


async def test_fifty_concurrent_appenders_leave_a_gapless_stream(postgres_dsn: str) -> None:
    store = await EventStore.open(postgres_dsn, pool_size=50)
    conflicts = 0

    async def appender(n: int) -> None:
        nonlocal conflicts
        while True:
            version = await store.stream_version("job-hot")
            try:
                await store.append("job-hot", version, [event("job-hot", n=n)])
                return
            except ConcurrencyError:
                conflicts += 1

    try:
        await asyncio.gather(*(appender(n) for n in range(50)))
        stored = await store.read_stream("job-hot")
    finally:
        await store.close()
    assert [e.version for e in stored] == list(range(1, 51))
    assert sorted(json.loads(e.data)["n"] for e in stored) == list(range(50))
    positions = [e.position for e in stored]
    assert positions == list(range(1, 51))
    assert conflicts > 0  # they really raced


async def test_a_reader_following_concurrent_appends_never_skips_an_event(postgres_dsn: str) -> None:
    """The outbox's requirement: reading `position > last seen` while appends commit concurrently
    must eventually return every event, none skipped by a late-committing transaction."""
    store = await EventStore.open(postgres_dsn, pool_size=20)
    seen: list[int] = []
    done = asyncio.Event()

    async def reader() -> None:
        after = 0
        while True:
            finished = done.is_set()
            batch = await store.read_all(after, limit=7)
            seen.extend(e.position for e in batch)
            if batch:
                after = batch[-1].position
            elif finished:
                return

    async def writer(stream: str) -> None:
        for _ in range(15):
            await store.append(stream, ANY, [event(stream), event(stream)])

    try:
        reading = asyncio.create_task(reader())
        await asyncio.gather(*(writer(f"job-{i}") for i in range(12)))
        done.set()
        await asyncio.wait_for(reading, 30)
    finally:
        await store.close()
    assert seen == list(range(1, 12 * 15 * 2 + 1))


@pytest.mark.parametrize("statement", [
    "UPDATE events SET type = 'Forged'",
    "DELETE FROM events",
    "TRUNCATE events",
    "TRUNCATE events CASCADE",
])
async def test_the_database_refuses_to_rewrite_history(store: EventStore, postgres_dsn: str,
                                                        statement: str) -> None:
    await store.append("job-1", 0, [event("job-1")])
    conn = await asyncpg.connect(postgres_dsn)  # a superuser: not even it may rewrite history
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="append-only"):
            await conn.execute(statement)
    finally:
        await conn.close()
    assert [e.type for e in await store.read_stream("job-1")] == ["Thing"]


async def test_replaying_a_committed_append_is_a_no_op(store: EventStore) -> None:
    batch = [event("job-1"), event("job-1")]
    assert await store.append("job-1", 0, batch) == 2
    await store.append("job-1", 2, [event("job-1")])
    assert await store.append("job-1", 0, batch) == 2  # stale version, but the same events: no-op
    assert await store.append("job-1", ANY, batch) == 2
    assert await store.stream_version("job-1") == 3


async def test_reusing_some_event_ids_in_a_different_append_is_refused(store: EventStore) -> None:
    first = event("job-1")
    await store.append("job-1", 0, [first])
    with pytest.raises(DuplicateEvent) as caught:
        await store.append("job-1", 1, [first, event("job-1")])
    assert caught.value.event_ids == [first.event_id]
    moved = NewEvent(event_id=first.event_id, stream="job-2", type="Thing", schema_version=1,
                     data=b"{}", correlation_id=None, causation_id=None, occurred_at=first.occurred_at)
    with pytest.raises(DuplicateEvent):
        await store.append("job-2", 0, [moved])
    assert await store.head_position() == 1


async def test_tracking_gives_a_redelivered_message_exactly_one_effect(store: EventStore) -> None:
    tracking = Tracking(consumer="quota", key="msg-7")
    assert not await store.was_processed("quota", "msg-7")
    assert await store.append("quota-a", ANY, [event("quota-a")], tracking=tracking) == 1
    again = await store.append("quota-a", ANY, [event("quota-a")], tracking=tracking)
    assert again == AlreadyProcessed("quota", "msg-7")
    assert await store.was_processed("quota", "msg-7")
    assert await store.stream_version("quota-a") == 1
    # The same key for another consumer is a different message handling.
    assert await store.append("quota-a", ANY, [event("quota-a")], tracking=Tracking("audit", "msg-7")) == 2


async def test_tracking_is_rolled_back_with_a_conflicting_append(store: EventStore) -> None:
    await store.append("job-1", 0, [event("job-1")])
    tracking = Tracking("admission", "msg-1")
    with pytest.raises(ConcurrencyError):
        await store.append_multi({"job-1": (0, [event("job-1")])}, tracking=tracking)
    assert not await store.was_processed("admission", "msg-1")
    assert await store.append_multi({"job-1": (1, [event("job-1")])}, tracking=tracking) == {"job-1": 2}


async def test_concurrent_deliveries_of_one_message_have_one_effect(store: EventStore) -> None:
    tracking = Tracking("placement", "msg-1")
    results = await asyncio.gather(*(store.append("gang-1", ANY, [event("gang-1")], tracking=tracking)
                                     for _ in range(8)))
    assert sum(1 for r in results if isinstance(r, AlreadyProcessed)) == 7
    assert await store.stream_version("gang-1") == 1


async def test_a_batch_of_handled_messages_is_recorded_all_or_nothing(store: EventStore) -> None:
    keys = [Tracking("admission", f"msg-{i}") for i in range(3)]
    versions = await store.append_handled({"job-a": (0, [event("job-a"), event("job-a")]),
                                           "job-b": (0, [event("job-b")])}, keys)
    assert versions == {"job-a": 2, "job-b": 1}
    assert all([await store.was_processed("admission", t.key) for t in keys])
    # A batch holding one message handled before writes nothing, not even the new keys.
    again = await store.append_handled({"job-c": (0, [event("job-c")])}, [Tracking("admission", "msg-9"), keys[1]])
    assert isinstance(again, AlreadyProcessed)
    assert await store.stream_version("job-c") == 0
    assert not await store.was_processed("admission", "msg-9")
    # A stale version refuses the whole batch, keys included.
    with pytest.raises(ConcurrencyError):
        await store.append_handled({"job-a": (1, [event("job-a")]), "job-d": (0, [event("job-d")])},
                                   [Tracking("admission", "msg-10")])
    assert not await store.was_processed("admission", "msg-10")
    assert await store.stream_version("job-d") == 0
    # Tracking rows alone (messages whose effect is nothing) are a batch too.
    assert await store.append_handled({}, [Tracking("admission", "msg-11")]) == {}
    assert await store.was_processed("admission", "msg-11")


async def test_a_batch_races_a_single_tracked_append_and_only_one_wins(store: EventStore) -> None:
    single = store.append_multi({}, tracking=Tracking("placement", "msg-1"))
    batch = store.append_handled({"job-1": (0, [event("job-1")])},
                                 [Tracking("placement", "msg-1"), Tracking("placement", "msg-2")])
    first, second = await asyncio.gather(single, batch)
    handled = [r for r in (first, second) if not isinstance(r, AlreadyProcessed)]
    assert len(handled) == 1
    assert await store.was_processed("placement", "msg-1")
    assert await store.was_processed("placement", "msg-2") == (await store.stream_version("job-1") == 1)


async def test_read_all_pages_in_global_order_and_filters_by_type(store: EventStore) -> None:
    for i in range(5):
        stream = f"job-{i}"
        await store.append(stream, 0, [event(stream, "JobSubmitted"), event(stream, "JobAdmitted")])
    assert [e.position for e in await store.read_all(3, limit=4)] == [4, 5, 6, 7]
    admitted = await store.read_all(types=["JobAdmitted"])
    assert [e.position for e in admitted] == [2, 4, 6, 8, 10]
    assert {e.type for e in admitted} == {"JobAdmitted"}


async def test_follow_sees_events_appended_after_it_started(store: EventStore) -> None:
    await store.append("job-1", 0, [event("job-1")])
    received: list[StoredEvent] = []
    three = asyncio.Event()

    async def follower() -> None:
        async with contextlib.aclosing(store.follow(0)) as events:
            async for e in events:
                received.append(e)
                if len(received) == 3:
                    three.set()

    task = asyncio.create_task(follower())
    try:
        await store.append("job-2", 0, [event("job-2")])
        await store.append("job-1", 1, [event("job-1")])
        await asyncio.wait_for(three.wait(), 5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert [(e.stream, e.position) for e in received] == [("job-1", 1), ("job-2", 2), ("job-1", 3)]


async def test_follow_wakes_on_notify_well_before_the_polling_interval(postgres_dsn: str) -> None:
    store = await EventStore.open(postgres_dsn, poll_interval=30)
    try:
        events = store.follow(0, types=["JobAdmitted"])
        first = asyncio.ensure_future(anext(events))
        await asyncio.sleep(0.2)  # let it find nothing and start waiting
        await store.append("job-1", 0, [event("job-1", "JobSubmitted"), event("job-1", "JobAdmitted")])
        got = await asyncio.wait_for(first, 5)
        await events.aclose()
    finally:
        await store.close()
    assert (got.type, got.position) == ("JobAdmitted", 2)


async def test_data_that_is_not_json_is_refused_naming_the_event(store: EventStore) -> None:
    bad = NewEvent(event_id="bad-1", stream="job-1", type="JobSubmitted", schema_version=1,
                   data=b"{not json", correlation_id=None, causation_id=None, occurred_at=datetime.now(UTC))
    with pytest.raises(InvalidEventData, match="bad-1"):
        await store.append("job-1", 0, [event("job-1"), bad])
    assert await store.head_position() == 0


async def test_checkpoints_and_relay_positions_only_move_forward(store: EventStore) -> None:
    assert await store.load_checkpoint("projector") == 0
    await store.save_checkpoint("projector", 5)
    await store.save_checkpoint("projector", 3)
    assert await store.load_checkpoint("projector") == 5
    assert await store.relay_position("relay") == 0
    await store.save_relay_position("relay", 9)
    await store.save_relay_position("relay", 2)
    assert await store.relay_position("relay") == 9


async def _events_rows_scanned(conn: asyncpg.Connection) -> int:
    """Rows of `events` read by sequential scans so far, this connection's own reads included."""
    await conn.execute("SELECT pg_stat_force_next_flush()")  # flushed as this statement ends
    return int(await conn.fetchval("SELECT seq_tup_read FROM pg_stat_user_tables WHERE relname = 'events'"))


async def test_an_append_on_a_connection_opened_while_the_log_was_small_does_not_scan_the_log(
        postgres_dsn: str) -> None:
    """A service's connection caches the append function's plans while the log holds a few events;
    after five calls PL/pgSQL keeps a generic plan costed for that small table (a sequential scan),
    which every later append ran, under the head lock, over the whole grown log (migration 062)."""
    early = await EventStore.open(postgres_dsn, pool_size=1, min_size=1)
    other = await EventStore.open(postgres_dsn, pool_size=1, min_size=1)
    try:
        for i in range(8):  # plans settle on this connection while the log is tiny
            await early.append_multi({f"job-early-{i}": (0, [event(f"job-early-{i}")])})
            await early.append_handled({f"job-handled-{i}": (0, [event(f"job-handled-{i}")])},
                                       [Tracking("admission", f"early-{i}")])
        for batch in range(10):  # the log grows to 3,000 events through another connection
            streams = [f"job-grown-{batch}-{i}" for i in range(300)]
            await other.append_multi({s: (0, [event(s)]) for s in streams})
        async with early.connection() as conn:
            before = await _events_rows_scanned(conn)
        for i in range(10):
            await early.append_multi({f"job-late-{i}": (0, [event(f"job-late-{i}")])})
            await early.append_handled({f"job-late-handled-{i}": (0, [event(f"job-late-handled-{i}")])},
                                       [Tracking("admission", f"late-{i}")])
        async with early.connection() as conn:
            scanned = await _events_rows_scanned(conn) - before
        assert scanned < 300, f"20 appends read {scanned} rows of a 3,016-event log by sequential scan"
    finally:
        await early.close()
        await other.close()


async def test_the_job_of_a_submission_id_is_its_users_and_found_without_scanning_the_log(
        store: EventStore, postgres_dsn: str) -> None:
    """A submission id is scoped to its user (migration 075): alice's and bob's equal ids are two
    jobs, the first submission of each counts, a submission that names no user (an old log) is the
    empty user's, and the lookup is an index read whatever the log's length."""
    def submitted(job: str, user: str | None, submission: str | None, in_spec: bool = False) -> NewEvent:
        data = {"job_id": job, "user": user,
                "submission_id": None if in_spec else submission, "spec": {"submission_id": submission}}
        return event(f"job-{job}", "JobSubmitted", **data)

    await store.append_multi({f"job-{j}": (0, [e]) for j, e in [
        ("ja", submitted("ja", "alice", "nightly")), ("jb", submitted("jb", "bob", "nightly")),
        ("jold", submitted("jold", None, "nightly", in_spec=True)), ("jx", submitted("jx", "alice", None))]})
    await store.append_multi({"job-ja2": (0, [submitted("ja2", "alice", "nightly")])})
    await store.append_multi({f"job-filler-{i}": (0, [event(f"job-filler-{i}")]) for i in range(3000)})
    admin = await asyncpg.connect(postgres_dsn)
    try:
        await admin.execute("ANALYZE events")
    finally:
        await admin.close()
    async with store.connection() as conn:
        before = await _events_rows_scanned(conn)
    for _ in range(8):  # past the point where asyncpg's prepared statement gets a generic plan
        assert await store.job_of_submission("alice", "nightly") == "ja"
        assert await store.job_of_submission("bob", "nightly") == "jb"
        assert await store.job_of_submission("", "nightly") == "jold"
        assert await store.job_of_submission("carol", "nightly") is None
    async with store.connection() as conn:
        scanned = await _events_rows_scanned(conn) - before
    assert scanned < 300, f"32 lookups read {scanned} rows of a 3,005-event log by sequential scan"
