"""A tamper-evident log: a row changed or removed by a superuser is detected, and an
exported bundle verifies offline."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import asyncpg

from corral.eventstore import EventStore, NewEvent
from corral.eventstore.chain import export_bundle, verify_bundle, verify_chain


def _event(i: int) -> NewEvent:
    return NewEvent(event_id=f"e{i}", stream=f"job-j{i % 3}", type="JobSubmitted", schema_version=1,
                    data=json.dumps({"user": "alice", "n": i}).encode(), correlation_id=f"j{i % 3}",
                    causation_id=None, occurred_at=datetime(2026, 12, 3, 9, 0, i, 123456, tzinfo=UTC))


async def _log(dsn: str, n: int = 6) -> None:
    store = await EventStore.open(dsn)
    try:
        versions: dict[str, int] = {}
        for i in range(1, n + 1):
            e = _event(i)
            await store.append(e.stream, versions.get(e.stream, 0), [e])
            versions[e.stream] = versions.get(e.stream, 0) + 1
        # several events in one append (one INSERT of many rows) chain too
        batch = [NewEvent(event_id=f"b{i}", stream="job-batch", type="JobSubmitted", schema_version=1,
                          data=b'{"user": "bob"}', correlation_id=None, causation_id=None,
                          occurred_at=datetime(2026, 12, 3, tzinfo=UTC)) for i in range(3)]
        await store.append("job-batch", 0, batch)
    finally:
        await store.close()


async def _as_superuser(dsn: str, sql: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute("SET LOCAL session_replication_role = replica")  # the trigger bypass
            await conn.execute(sql)
    finally:
        await conn.close()


async def test_an_intact_log_verifies_and_its_bundle_verifies_offline(postgres_dsn: str, tmp_path: Path) -> None:
    await _log(postgres_dsn)
    result = await verify_chain(postgres_dsn)
    assert result.ok and result.checked == 9, result.message
    bundle = tmp_path / "log.jsonl"
    assert await export_bundle(postgres_dsn, bundle) == 9
    assert verify_bundle(bundle).ok
    lines = bundle.read_text().splitlines()
    row = json.loads(lines[3])
    row["data"] = row["data"].replace("alice", "mallory")
    lines[3] = json.dumps(row)
    bundle.write_text("\n".join(lines) + "\n")
    assert verify_bundle(bundle).first_bad_position == 4


async def test_a_row_changed_by_a_superuser_is_named(postgres_dsn: str) -> None:
    await _log(postgres_dsn)
    await _as_superuser(postgres_dsn, "UPDATE events SET data = '{\"user\": \"mallory\", \"n\": 3}' WHERE position = 3")
    result = await verify_chain(postgres_dsn)
    assert result.first_bad_position == 3, result.message
    assert "position 3" in result.message


async def test_a_row_deleted_by_a_superuser_is_named(postgres_dsn: str) -> None:
    await _log(postgres_dsn)
    await _as_superuser(postgres_dsn, "DELETE FROM events WHERE position = 5")
    result = await verify_chain(postgres_dsn)
    assert result.first_bad_position == 5, result.message


def test_corral_events_export_writes_a_bundle_that_verifies(postgres_dsn: str, tmp_path: Path) -> None:
    import asyncio

    from typer.testing import CliRunner

    from corral.cli.main import app

    asyncio.run(_log(postgres_dsn))
    bundle = tmp_path / "export.jsonl"
    env = {"CORRAL_NATS_URL": "nats://127.0.0.1:1", "CORRAL_POSTGRES_DSN": postgres_dsn,
           "CORRAL_CONTEXT": str(tmp_path / "none.json")}
    result = CliRunner().invoke(app, ["events", "--export", str(bundle)], env=env)
    assert result.exit_code == 0, result.output
    assert "Exported 9 event(s)" in result.output
    assert verify_bundle(bundle).ok


def test_corral_audit_verify_names_a_row_a_superuser_changed(postgres_dsn: str, tmp_path: Path) -> None:
    import asyncio

    from typer.testing import CliRunner

    from corral.cli.main import app

    asyncio.run(_log(postgres_dsn))
    asyncio.run(_as_superuser(postgres_dsn, "UPDATE events SET data = '{\"user\": \"mallory\", \"n\": 2}' "
                                            "WHERE position = 2"))
    env = {"CORRAL_NATS_URL": "nats://127.0.0.1:1", "CORRAL_POSTGRES_DSN": postgres_dsn,
           "CORRAL_CONTEXT": str(tmp_path / "none.json"), "COLUMNS": "200"}
    result = CliRunner().invoke(app, ["audit", "verify", "--json"], env=env)
    assert result.exit_code == 1, result.output
    assert json.loads(result.output)["hash_chain"]["first_bad_position"] == 2
