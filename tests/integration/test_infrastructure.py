"""The test infrastructure itself: real servers, isolated per test."""

import asyncpg
import nats

from tests.conftest import Infra


async def test_each_test_gets_a_real_jetstream_and_an_empty_database(infra: Infra) -> None:
    conn = await asyncpg.connect(infra.postgres_dsn)
    try:
        tables = await conn.fetchval("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
    finally:
        await conn.close()
    assert tables == 0
    nc = await nats.connect(infra.nats_url)
    try:
        info = await nc.jetstream().account_info()
    finally:
        await nc.close()
    assert info.limits is not None
