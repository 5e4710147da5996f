"""Migrations run once, in order, even when several services start at the same moment."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from corral.eventstore import EventStore, MigrationError
from corral.eventstore.migrate import Migration, apply_migrations, bundled_migrations


async def test_concurrent_starters_apply_each_migration_once(postgres_dsn: str) -> None:
    stores = await asyncio.gather(*(EventStore.open(postgres_dsn, pool_size=1) for _ in range(6)))
    for store in stores:
        await store.close()
    conn = await asyncpg.connect(postgres_dsn)
    try:
        names = [r["name"] for r in await conn.fetch("SELECT name FROM schema_migrations ORDER BY name")]
        assert names == [m.name for m in bundled_migrations()]
        assert await apply_migrations(conn) == []  # a second start is a no-op
    finally:
        await conn.close()


async def test_a_new_numbered_file_is_applied_after_the_existing_ones(postgres_dsn: str) -> None:
    conn = await asyncpg.connect(postgres_dsn)
    try:
        await apply_migrations(conn)
        extra = Migration("900_placement_extra.sql", "CREATE TABLE placement_extra (id text PRIMARY KEY);")
        assert await apply_migrations(conn, [*bundled_migrations(), extra]) == ["900_placement_extra.sql"]
        assert await conn.fetchval("SELECT count(*) FROM placement_extra") == 0
    finally:
        await conn.close()


async def test_editing_an_applied_migration_is_refused(postgres_dsn: str) -> None:
    conn = await asyncpg.connect(postgres_dsn)
    try:
        await apply_migrations(conn, [Migration("001_a.sql", "CREATE TABLE a (id int);")])
        with pytest.raises(MigrationError, match=r"001_a\.sql.*changed"):
            await apply_migrations(conn, [Migration("001_a.sql", "CREATE TABLE a (id bigint);")])
    finally:
        await conn.close()


async def test_a_failing_migration_leaves_nothing_half_applied(postgres_dsn: str) -> None:
    conn = await asyncpg.connect(postgres_dsn)
    try:
        broken = Migration("001_broken.sql", "CREATE TABLE b (id int); SELECT no_such_function();")
        with pytest.raises(MigrationError, match=r"001_broken\.sql"):
            await apply_migrations(conn, [broken])
        assert await conn.fetchval("SELECT to_regclass('b')") is None
        assert await conn.fetchval("SELECT count(*) FROM schema_migrations") == 0
    finally:
        await conn.close()
