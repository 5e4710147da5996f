"""The service role cannot rewrite the log: a superuser bypasses the append-only trigger with
`session_replication_role` or `DISABLE TRIGGER`, so no service is one."""

from __future__ import annotations

import asyncpg
import pytest

from corral.eventstore import EventStore

_INSERT = ("INSERT INTO events (stream, version, position, event_id, type, schema_version, data, occurred_at) "
           "VALUES ('job-j1', 1, 1, 'e1', 'JobSubmitted', 1, '{\"user\": \"alice\"}', now())")

ATTACKS = [
    "UPDATE events SET data = '{\"user\": \"mallory\"}'::json",
    "DELETE FROM events",
    "TRUNCATE events",
    "SET session_replication_role = replica",
    "ALTER TABLE events DISABLE TRIGGER USER",
    "ALTER TABLE events DISABLE TRIGGER events_no_update_or_delete",
    "COPY (SELECT 1) TO PROGRAM 'id'",
    "DELETE FROM allocations",
    "UPDATE consumer_tracking SET consumer = 'x'",
]


@pytest.fixture
async def service_conn(postgres_dsn: str) -> asyncpg.Connection:
    store = await EventStore.open(postgres_dsn)  # migrations applied, as a service start does
    await store.close()
    conn = await asyncpg.connect(postgres_dsn)
    await conn.execute("SET ROLE corral_service")
    await conn.execute(_INSERT)  # INSERT is granted: the service role appends
    yield conn
    await conn.close()


@pytest.mark.parametrize("sql", ATTACKS)
async def test_the_service_role_cannot_rewrite_history(service_conn: asyncpg.Connection, sql: str) -> None:
    assert await service_conn.fetchval("SELECT current_user") == "corral_service"
    with pytest.raises(asyncpg.PostgresError) as refused:
        await service_conn.execute(sql)
    assert isinstance(refused.value, asyncpg.InsufficientPrivilegeError | asyncpg.PostgresError)
    assert "permission denied" in str(refused.value) or "must be" in str(refused.value) \
        or "superuser" in str(refused.value), str(refused.value)


async def test_the_service_role_appends_and_reads(postgres_dsn: str) -> None:
    store = await EventStore.open(postgres_dsn)
    await store.close()
    conn = await asyncpg.connect(postgres_dsn)
    try:
        await conn.execute("SET ROLE corral_service")
        await conn.execute(_INSERT)
        assert await conn.fetchval("SELECT count(*) FROM events") == 1
        await conn.execute("SET ROLE corral_reader")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("INSERT INTO relay_positions VALUES ('x', 1)")
    finally:
        await conn.close()
