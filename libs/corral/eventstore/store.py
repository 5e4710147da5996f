"""The Postgres event store: append-only streams with optimistic concurrency and a global order.

Ordering, the problem this module solves
----------------------------------------
Readers of the whole log (the outbox relay above all) remember "I have seen everything up to
position N" and later ask for `position > N`. With a plain `bigserial`, positions are handed out at
INSERT time but become visible at COMMIT time: transaction A takes 41, B takes 42, B commits first,
a reader sees 42 and moves past it, then A commits 41, which that reader never sees again. The
relay would silently lose an event.

The fix used here: every appending transaction first locks the single row of `event_log_head`
(`SELECT position ... FOR UPDATE`) and takes its positions from it, advancing it in the same
transaction. Appends are therefore serialised from that point to COMMIT: B cannot obtain a position
until A has committed (Postgres makes a transaction visible before it releases its locks), so
positions become visible strictly in order and, because a rolled-back append also rolls back the
head, without gaps. A reader that saw position N has seen every position below N.

The whole append (tracking check, version checks, id check, inserts, head update, NOTIFY) runs
as one server-side function, `corral_append` (migrations/005_append_function.sql), called as a
single autocommit statement: the head lock is held for one function execution plus the commit,
never across client round trips. Nothing is written unless every check passes.

The cost is one append at a time. Measured on the 2-core dev box (bench/eventstore.py): about
1,000 single-event appends/s and 6,000-8,000 events/s in 10-event appends, far above what a
scheduler emits. (The alternative, reading only below `pg_snapshot_xmin(pg_current_snapshot())`
with an xid8 column, allows parallel appends but makes every reader lag behind the oldest running
transaction and needs a gap-tolerant position; we do not need the extra throughput.)

Note on the lock statement: it must be a statement of its own. Under READ COMMITTED a statement's
snapshot is taken when it starts; a query that locked the head and read stream versions in one
statement would, after waiting for the lock, still read versions from before the previous
appender committed. Inside the (VOLATILE) function each statement takes a fresh snapshot.

Idempotency of appends
----------------------
Event ids are unique. Re-appending events that are all already stored, each in the stream named,
is an idempotent no-op that returns the versions they were stored at (so a caller that lost the
reply to a committed append can retry safely). A partial overlap, or an id stored in another
stream, raises `DuplicateEvent`: two different appends are reusing ids.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, overload

from corral.eventstore.errors import ConcurrencyError, DuplicateEvent, EventStoreError, InvalidEventData
from corral.eventstore.migrate import migrate_if_needed, pending_names
from corral.eventstore.recent import RecentEvents
from corral.eventstore.records import (
    ANY,
    AlreadyProcessed,
    ExpectedVersion,
    NewEvent,
    StoredEvent,
    Tracking,
)
from corral.telemetry import tracing

_COLUMNS = ("event_id, stream, type, schema_version, data::text AS data, correlation_id, causation_id,"
            " occurred_at, version, position, recorded_at, trace_context")

if TYPE_CHECKING:
    from corral.eventstore.wakeups import AppendWakeups

#: The channel every append NOTIFYs at commit (`corral.eventstore.wakeups.CHANNEL`).
APPEND_CHANNEL = "corral_events"

Plan = list[tuple[str, ExpectedVersion, list[NewEvent]]]

AppendObserver = Callable[[float, int], None]
"""Told (seconds the append took, events written) after each append that reached the database,
whatever its outcome (`EventStore.observe_appends`; the services' append-latency metric)."""


def _stored(row: Any) -> StoredEvent:
    return StoredEvent(
        event_id=row["event_id"], stream=row["stream"], type=row["type"],
        schema_version=row["schema_version"], data=row["data"].encode(),
        correlation_id=row["correlation_id"], causation_id=row["causation_id"],
        occurred_at=row["occurred_at"], version=row["version"], position=row["position"],
        recorded_at=row["recorded_at"], trace_context=row["trace_context"],
    )


def _recalled(events: list[StoredEvent]) -> list[StoredEvent]:
    """Events read, after telling tracing their stored trace contexts (a no-op when it is off)."""
    tracing.recall(events)
    return events


def _check_expected(stream: str, expected: ExpectedVersion) -> None:
    if expected is ANY:
        return
    if isinstance(expected, bool) or not isinstance(expected, int) or expected < 0:
        raise ValueError(f"expected_version for stream {stream!r} must be an int >= 0 (the number of "
                         f"events already in the stream) or ANY, got {expected!r}")


def _columns(plan: Plan) -> list[list[Any]]:
    """The first ten arguments of corral_append / corral_append_tracked: streams, expected
    versions, batch sizes, then one array per event column (the functions take columns, so an
    append of N events is one statement)."""
    events = [event for _, _, batch in plan for event in batch]
    return [
        [stream for stream, _, _ in plan],
        [-1 if expected is ANY else expected for _, expected, _ in plan],
        [len(batch) for _, _, batch in plan],
        [e.event_id for e in events],
        [e.type for e in events],
        [e.schema_version for e in events],
        [bytes(e.data).decode("utf-8") for e in events],
        [e.correlation_id for e in events],
        [e.causation_id for e in events],
        [e.occurred_at for e in events],
    ]


async def _keep_session(conn: Any) -> None:
    """What a pooled connection needs when it goes back to the pool: nothing more.

    asyncpg's default reset sends `pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL` on
    every release: a round trip per statement, as many as the appends and reads together (~1,900
    for 200 jobs in bench/e2e.py). The store leaves no session state on its pooled connections —
    no session settings (the trace context is transaction-local), LISTEN on a connection of its
    own (`corral.eventstore.wakeups`), the migration lock released before release — and asyncpg
    still rolls back a transaction left open before calling this."""


def _events(plan: Plan) -> list[NewEvent]:
    return [event for _, _, batch in plan for event in batch]


def _call(function: str, traces: dict[str, str] | None) -> str:
    """The append statement: the `_traced` variant (migrations/060) stores each event's trace
    context; without traces, the plain function (what every append does when tracing is off)."""
    if traces is None:
        return f"SELECT * FROM {function}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
    return f"SELECT * FROM {function}_traced($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"


def _traces(traces: dict[str, str] | None) -> list[str]:
    return [] if traces is None else [json.dumps(traces)]


def _plan(batches: Mapping[str, tuple[ExpectedVersion, Sequence[NewEvent]]]) -> Plan:
    plan: Plan = []
    seen: set[str] = set()
    for stream, (expected, events) in batches.items():
        if not isinstance(stream, str) or not stream:
            raise ValueError(f"stream must be a non-empty string, got {stream!r}")
        _check_expected(stream, expected)
        for event in events:
            if event.stream != stream:
                raise ValueError(f"event {event.event_id!r} names stream {event.stream!r} but is "
                                 f"appended to {stream!r}; set NewEvent.stream to the target stream")
            if event.event_id in seen:
                raise ValueError(f"event_id {event.event_id!r} appears twice in one append")
            seen.add(event.event_id)
        plan.append((stream, expected, list(events)))
    return plan


class EventStore:
    """Append-only event streams in Postgres. Open with `await EventStore.open(dsn)`."""

    def __init__(self, pool: Any, dsn: str, *, poll_interval: float) -> None:
        self._pool = pool
        self._dsn = dsn
        self._wakeups: AppendWakeups | None = None  # made by the first follower: a reader needs none
        self._poll_interval = poll_interval
        self._observers: list[AppendObserver] = []
        #: what `follow_batches` read last, for `read_all` (`corral.eventstore.recent`)
        self._recent = RecentEvents()

    @classmethod
    def blocking(cls, dsn: str, timeout: float = 5.0) -> EventStore | None:
        """A store over one blocking connection (`corral.eventstore.wire`) for a command-line
        reader: its coroutines never suspend (run them with `wire.finish`), no event loop, no
        asyncpg. `wire.Unsupported` when the DSN asks for what that connection does not speak;
        None when migrations are pending (`open` says what to do about them)."""
        from corral.eventstore import wire

        conn = wire.Connection.open(dsn, timeout)
        try:
            if wire.finish(pending_names(conn)):
                conn.close()
                return None
        except BaseException:
            conn.close()
            raise
        return cls(wire.Pool(conn, APPEND_CHANNEL), dsn, poll_interval=1.0)

    def _follower_wakeups(self) -> AppendWakeups:
        if self._wakeups is None:
            from corral.eventstore.wakeups import AppendWakeups

            self._wakeups = AppendWakeups(self._dsn)
        return self._wakeups

    async def listen(self) -> None:
        """Before the first of several polls (`pause` between them): a blocking store's pause
        then wakes at any append after this, one landing between a poll and the pause after it
        included; the event loop's pause is a sleep, and this does nothing for it."""
        listen = getattr(self._pool, "listen", None)
        if listen is not None:
            await listen()

    async def pause(self, seconds: float) -> None:
        """Wait between two polls of the log: the event loop's sleep, or the thread's for a
        blocking store (which runs with no loop), which an append's NOTIFY ends (see `listen`)."""
        pause = getattr(self._pool, "pause", None)
        if pause is not None:
            await pause(seconds)
            return
        import asyncio

        await asyncio.sleep(seconds)

    def observe_appends(self, observer: AppendObserver) -> None:
        """Call `observer` after every append (see `AppendObserver`)."""
        self._observers.append(observer)

    def _appended(self, started: float, plan: Plan) -> None:
        if self._observers:
            took, count = time.perf_counter() - started, sum(len(batch) for _, _, batch in plan)
            for observer in self._observers:
                observer(took, count)

    @classmethod
    async def open(cls, dsn: str, *, pool_size: int = 10, poll_interval: float = 1.0,
                   min_size: int = 2) -> EventStore:
        """Connect, apply pending migrations (safe with concurrent starters) and return the store.

        A login that may not run DDL (a service's, the CLI's) opens a migrated database: with
        nothing pending, nothing is written (see `corral.eventstore.migrate.migrate_if_needed`).

        `poll_interval` bounds how late `follow()` notices an append if a NOTIFY is lost.
        """
        if pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {pool_size}")
        import asyncpg  # here: a command-line reader opens its store without it (`wire`)

        from corral.eventstore import pool_logs  # as asyncpg: it loads `logging`

        pool_logs.install()  # an outage's reconnect tries in one line each, not a traceback
        # The migration check runs on the pool's first connection: each connection costs a scram
        # handshake, and a CLI command (`corral jobs`) is over in a few queries.
        pool = await asyncpg.create_pool(dsn, min_size=min(min_size, pool_size), max_size=pool_size,
                                         reset=_keep_session)
        try:
            async with pool.acquire() as conn:
                await migrate_if_needed(conn)
        except BaseException:
            await pool.close()
            raise
        return cls(pool, dsn, poll_interval=poll_interval)

    async def close(self) -> None:
        if self._wakeups is not None:
            await self._wakeups.close()
        await self._pool.close()

    async def __aenter__(self) -> EventStore:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # -- appending ---------------------------------------------------------------------------

    @overload
    async def append(self, stream: str, expected_version: ExpectedVersion,
                     events: Sequence[NewEvent], *, tracking: None = None) -> int: ...

    @overload
    async def append(self, stream: str, expected_version: ExpectedVersion,
                     events: Sequence[NewEvent], *, tracking: Tracking) -> int | AlreadyProcessed: ...

    async def append(self, stream: str, expected_version: ExpectedVersion,
                     events: Sequence[NewEvent], *, tracking: Tracking | None = None
                     ) -> int | AlreadyProcessed:
        """Append `events` to `stream` if it holds exactly `expected_version` events.

        Returns the stream's version after the append (its last event's version). Raises
        `ConcurrencyError` on a stale `expected_version`; with `tracking`, returns
        `AlreadyProcessed` (writing nothing) when that message was handled before.
        """
        if not events:
            raise ValueError(f"append to {stream!r} needs at least one event; "
                             "use stream_version() to read the version")
        result = await self._append(_plan({stream: (expected_version, events)}), tracking)
        return result if isinstance(result, AlreadyProcessed) else result[stream]

    @overload
    async def append_multi(self, batches: Mapping[str, tuple[ExpectedVersion, Sequence[NewEvent]]],
                           *, tracking: None = None) -> dict[str, int]: ...

    @overload
    async def append_multi(self, batches: Mapping[str, tuple[ExpectedVersion, Sequence[NewEvent]]],
                           *, tracking: Tracking) -> dict[str, int] | AlreadyProcessed: ...

    async def append_multi(self, batches: Mapping[str, tuple[ExpectedVersion, Sequence[NewEvent]]],
                           *, tracking: Tracking | None = None) -> dict[str, int] | AlreadyProcessed:
        """Append to several streams in ONE transaction: all or nothing.

        `batches` maps stream -> (expected_version, events). A stream with an empty event list
        only asserts its version (useful to decide on one stream and guard on another). Any
        conflict raises `ConcurrencyError` for the first conflicting stream and writes nothing.
        Returns each stream's version after the append. An empty `batches` with `tracking` only
        records the tracking key (a consumer whose effect on the log is "nothing").
        """
        return await self._append(_plan(batches), tracking)

    async def _append(self, plan: Plan, tracking: Tracking | None) -> dict[str, int] | AlreadyProcessed:
        import asyncpg

        streams = [stream for stream, _, _ in plan]
        async with self._pool.acquire() as conn:
            started = time.perf_counter()
            try:
                with tracing.appending(_events(plan), "corral_append") as traces:
                    # One autocommit statement: the head lock is held only inside the database.
                    row = await conn.fetchrow(
                        _call("corral_append", traces), *_columns(plan),
                        tracking.consumer if tracking else None, tracking.key if tracking else None,
                        *_traces(traces))
            except (asyncpg.InvalidTextRepresentationError, UnicodeDecodeError) as exc:
                raise self._invalid_data(plan, exc) from exc
            finally:
                self._appended(started, plan)
            status = row["status"]
            if status == "ok":
                return dict(zip(streams, row["versions"] or [], strict=True))
            if status == "already_processed":
                assert tracking is not None
                return AlreadyProcessed(tracking.consumer, tracking.key)
            replayed = await self._replayed_versions(conn, plan)
            if replayed is None:
                if status == "conflict":
                    raise ConcurrencyError(row["conflict_stream"], row["conflict_expected"],
                                           row["conflict_actual"])
                raise EventStoreError(f"corral_append returned {status!r}")  # pragma: no cover
            if tracking is not None and not await self._record_tracking(conn, tracking):
                return AlreadyProcessed(tracking.consumer, tracking.key)
            return replayed

    async def append_handled(self, batches: Mapping[str, tuple[ExpectedVersion, Sequence[NewEvent]]],
                             trackings: Sequence[Tracking]) -> dict[str, int] | AlreadyProcessed:
        """`append_multi` as the one effect of handling SEVERAL messages: one tracking row each,
        all in the same transaction as the events (migrations/006_append_tracked.sql).

        Why: a consumer that handles a fetched batch of messages commits once instead of once per
        message. All or nothing: if any message of the batch was handled before (or is being
        recorded concurrently), nothing is written and `AlreadyProcessed` is returned — the caller
        then handles the messages one by one with `append_multi(..., tracking=...)`, which tells
        each apart. A stale expected version raises `ConcurrencyError`, a reused event id
        `DuplicateEvent` (no replay detection here: the one-by-one path has it).
        """
        consumers = {t.consumer for t in trackings}
        if len(consumers) != 1:
            raise ValueError(f"append_handled needs tracking keys of exactly one consumer, got {sorted(consumers)}")
        consumer = consumers.pop()
        import asyncpg

        plan = _plan(batches)
        streams = [stream for stream, _, _ in plan]
        keys = [t.key for t in trackings]
        async with self._pool.acquire() as conn:
            started = time.perf_counter()
            try:
                with tracing.appending(_events(plan), "corral_append_tracked") as traces:
                    row = await conn.fetchrow(_call("corral_append_tracked", traces), *_columns(plan),
                                              consumer, keys, *_traces(traces))
            except (asyncpg.InvalidTextRepresentationError, UnicodeDecodeError) as exc:
                raise self._invalid_data(plan, exc) from exc
            except asyncpg.PostgresError as exc:
                if getattr(exc, "sqlstate", None) == "CR001":
                    return AlreadyProcessed(consumer, ",".join(keys))
                raise
            finally:
                self._appended(started, plan)
        status = row["status"]
        if status == "ok":
            return dict(zip(streams, row["versions"] or [], strict=True))
        if status == "already_processed":
            return AlreadyProcessed(consumer, ",".join(keys))
        if status == "conflict":
            raise ConcurrencyError(row["conflict_stream"], row["conflict_expected"], row["conflict_actual"])
        if status == "duplicate":
            raise DuplicateEvent(sorted(e.event_id for _, _, batch in plan for e in batch))
        raise EventStoreError(f"corral_append_tracked returned {status!r}")  # pragma: no cover

    async def _record_tracking(self, conn: Any, tracking: Tracking) -> bool:
        fresh = await conn.fetchval(
            "INSERT INTO consumer_tracking (consumer, key) VALUES ($1, $2)"
            " ON CONFLICT DO NOTHING RETURNING true", tracking.consumer, tracking.key)
        return bool(fresh)

    async def _replayed_versions(self, conn: Any, plan: Plan) -> dict[str, int] | None:
        """If every event of `plan` is already stored in its stream, the versions it got; None if
        none is stored; raises `DuplicateEvent` on a partial overlap."""
        wanted = {event.event_id: stream for stream, _, batch in plan for event in batch}
        if not wanted:
            return None
        rows = await conn.fetch("SELECT event_id, stream, version FROM events WHERE event_id = ANY($1)",
                                list(wanted))
        if not rows:
            return None
        misplaced = [row["event_id"] for row in rows if row["stream"] != wanted[row["event_id"]]]
        if len(rows) != len(wanted) or misplaced:
            raise DuplicateEvent(sorted(row["event_id"] for row in rows))
        stored = {row["event_id"]: row["version"] for row in rows}
        versions: dict[str, int] = {}
        for stream, _, batch in plan:
            if batch:
                versions[stream] = max(stored[event.event_id] for event in batch)
            else:
                versions[stream] = await conn.fetchval(
                    "SELECT coalesce(max(version), 0) FROM events WHERE stream = $1", stream)
        return versions

    @staticmethod
    def _invalid_data(plan: Plan, exc: Exception) -> InvalidEventData:
        for _, _, batch in plan:
            for event in batch:
                try:
                    json.loads(bytes(event.data))
                except ValueError:
                    return InvalidEventData(f"event {event.event_id!r} ({event.type}): data is not valid "
                                            "JSON; encode the event with the contracts registry")
        return InvalidEventData(f"an event's data was refused by the database: {exc}")

    # -- reading -----------------------------------------------------------------------------

    def connection(self) -> Any:
        """A pooled connection (`async with store.connection() as conn:`), for readers that need
        several statements in one transaction (the read models, `corral.readmodel`)."""
        return self._pool.acquire()


    async def stream_version(self, stream: str) -> int:
        """How many events `stream` holds (0 if it does not exist)."""
        async with self._pool.acquire() as conn:
            version = await conn.fetchval(
                "SELECT coalesce(max(version), 0) FROM events WHERE stream = $1", stream)
        return int(version)

    async def positions_of(self, event_ids: Sequence[str]) -> dict[str, int]:
        """The log position of each of `event_ids` that is in the log."""
        if not event_ids:
            return {}
        async with self._pool.acquire() as conn:
            rows = await conn.fetch("SELECT event_id, position FROM events WHERE event_id = ANY($1::text[])",
                                    list(event_ids))
        return {r["event_id"]: r["position"] for r in rows}

    async def job_of_submission(self, user: str, submission_id: str) -> str | None:
        """The job id of the first JobSubmitted of `user` with `submission_id` (a recorded
        submission without a user counts as the empty user's), or None. One lookup in the index
        of migration 075, whatever the log's length: the function of migration 076 (a person's
        login, which reads the log through a view, finds its own version first)."""
        async with self._pool.acquire() as conn:
            return await conn.fetchval("SELECT job_of_submission($1, $2)", user, submission_id)

    async def jobs_of_submissions(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """`job_of_submission` of each (user, submission id) of `keys` that has a job, in one
        statement (one lookup in the index of migration 075 each)."""
        if not keys:
            return {}
        async with self._pool.acquire() as conn:
            rows = await conn.fetch("SELECT who, submission, job_of_submission(who, submission) AS job_id "
                                    "FROM unnest($1::text[], $2::text[]) AS k(who, submission)",
                                    [k[0] for k in keys], [k[1] for k in keys])
        return {(r["who"], r["submission"]): r["job_id"] for r in rows if r["job_id"] is not None}

    async def head_position(self) -> int:
        """The global position of the last committed event (0 for an empty log)."""
        async with self._pool.acquire() as conn:
            return int(await conn.fetchval("SELECT position FROM event_log_head WHERE id"))

    async def stream_exists(self, stream: str) -> bool:
        """Whether `stream` has any event (one index probe, nothing decoded)."""
        async with self._pool.acquire() as conn:
            return bool(await conn.fetchval("SELECT EXISTS (SELECT 1 FROM events WHERE stream = $1)", stream))

    async def read_stream(self, stream: str, from_version: int = 1) -> list[StoredEvent]:
        """The events of `stream` with version >= `from_version`, in version order."""
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(
                f"SELECT {_COLUMNS} FROM events WHERE stream = $1 AND version >= $2 ORDER BY version",
                stream, from_version)
        return _recalled([_stored(row) for row in rows])

    async def read_all(self, after_position: int = 0, limit: int = 1000,
                       types: Sequence[str] | None = None) -> list[StoredEvent]:
        """Up to `limit` events with position > `after_position`, in global order, optionally only
        the given `types`. Safe to checkpoint on: no later call returns a position below these.
        Of the whole log, what a follower of this store read lately comes from memory
        (`corral.eventstore.recent`) and only the rest from the database."""
        if types is None:
            held = self._recent.after(after_position, limit)
            if held:
                if len(held) == limit:
                    return _recalled(held)
                return _recalled(held) + await self._read_all(held[-1].position, limit - len(held), None)
        return await self._read_all(after_position, limit, types)

    async def _read_all(self, after_position: int, limit: int, types: Sequence[str] | None) -> list[StoredEvent]:
        # Two statements, not one with "$3 IS NULL OR type = ANY($3)": a prepared statement gets a
        # generic plan after five runs, which cannot drop that OR, and the one made while the log
        # was small (a seq scan and a sort) was kept as it grew: the relay's every read scanned the
        # whole table (~1.3 ms of Postgres CPU per job in bench/e2e.py).
        async with self._pool.acquire() as conn:
            if types is None:
                rows = await conn.fetch(f"SELECT {_COLUMNS} FROM events WHERE position > $1"
                                        " ORDER BY position LIMIT $2", after_position, limit)
            else:
                rows = await conn.fetch(f"SELECT {_COLUMNS} FROM events WHERE position > $1"
                                        " AND type = ANY($3::text[]) ORDER BY position LIMIT $2",
                                        after_position, limit, list(types))
        return _recalled([_stored(row) for row in rows])

    async def follow_batches(self, after_position: int = 0, *, limit: int = 1000,
                             types: Sequence[str] | None = None) -> AsyncGenerator[list[StoredEvent], None]:
        """Yield non-empty batches of new events forever, in global order, starting after
        `after_position`. Wakes on NOTIFY, re-reads every `poll_interval` in any case."""
        after = after_position
        while True:
            armed = await self._follower_wakeups().arm()
            head = await self.head_position() if types is not None else None
            batch = await self.read_all(after, limit, types)
            if batch:
                if types is None:
                    self._recent.remember(batch)
                after = batch[-1].position
                yield batch
                continue
            if head is not None:
                # Nothing of these types up to `head`: skip the non-matching events for good.
                after = max(after, head)
            await self._follower_wakeups().wait(armed, self._poll_interval)

    async def follow(self, after_position: int = 0, *,
                     types: Sequence[str] | None = None) -> AsyncGenerator[StoredEvent, None]:
        """Yield every event after `after_position`, then each new one as it is appended, forever.

        Close it with `contextlib.aclosing` (or by cancelling the task that iterates it)."""
        async for batch in self.follow_batches(after_position, types=types):
            for event in batch:
                yield event

    # -- consumers and relays ------------------------------------------------------------------

    async def was_processed(self, consumer: str, key: str) -> bool:
        """Whether `consumer` already recorded the message `key` (see `Tracking`)."""
        async with self._pool.acquire() as conn:
            found = await conn.fetchval(
                "SELECT true FROM consumer_tracking WHERE consumer = $1 AND key = $2", consumer, key)
        return bool(found)

    async def load_checkpoint(self, consumer: str) -> int:
        """The global position `consumer` saved last (0 if never)."""
        async with self._pool.acquire() as conn:
            position = await conn.fetchval(
                "SELECT position FROM consumer_checkpoints WHERE consumer = $1", consumer)
        return int(position or 0)

    async def save_checkpoint(self, consumer: str, position: int) -> None:
        """Remember that `consumer` has handled everything up to `position` (never moves back)."""
        async with self._pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO consumer_checkpoints (consumer, position) VALUES ($1, $2)"
                " ON CONFLICT (consumer) DO UPDATE SET"
                " position = GREATEST(consumer_checkpoints.position, EXCLUDED.position), updated_at = now()",
                consumer, position)

    async def relay_position(self, relay: str) -> int:
        """The last global position the outbox relay `relay` published and saw acknowledged."""
        async with self._pool.acquire() as conn:
            position = await conn.fetchval("SELECT position FROM relay_positions WHERE relay = $1", relay)
        return int(position or 0)

    async def relay_backlog(self, relay: str) -> tuple[int, int, datetime | None]:
        """(the log's head position, the last position `relay` published, when the oldest event it
        has not published yet was recorded — None if it is caught up): the relay's lag."""
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT h.position AS head, coalesce(r.position, 0) AS relayed,"
                " (SELECT recorded_at FROM events WHERE position = coalesce(r.position, 0) + 1) AS oldest"
                " FROM event_log_head h LEFT JOIN relay_positions r ON r.relay = $1 WHERE h.id", relay)
        return int(row["head"]), int(row["relayed"]), row["oldest"]

    async def save_relay_position(self, relay: str, position: int) -> None:
        """Record the relay's progress (never moves back)."""
        async with self._pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO relay_positions (relay, position) VALUES ($1, $2)"
                " ON CONFLICT (relay) DO UPDATE SET"
                " position = GREATEST(relay_positions.position, EXCLUDED.position), updated_at = now()",
                relay, position)
