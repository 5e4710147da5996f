"""`corral up`'s Postgres asks every TCP login for its password, and each process gets its own login.

An embedded Postgres that trusts loopback TCP lets any local user connect as the superuser
`postgres` without a password.
"""

from __future__ import annotations

import asyncio
import shutil
import stat
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from corral.eventstore import EventStore
from corral.eventstore.errors import MigrationError
from corral.eventstore.records import NewEvent, Tracking
from corral.stack import pglogins
from corral.stack.servers import PostgresServer
from corral.stack.up import SERVICES


@pytest.fixture(scope="module")
def embedded() -> Iterator[PostgresServer]:
    data = Path(tempfile.mkdtemp(prefix="corral-pgauth-"))
    server = PostgresServer(data).start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)


async def test_tcp_without_a_password_is_refused(embedded: PostgresServer) -> None:
    for user in ("postgres", "nobody"):
        with pytest.raises((asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError)):
            await asyncpg.connect(host=embedded.host, port=embedded.port, user=user, database="postgres",
                                  password="", passfile="/nonexistent")
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(host=embedded.host, port=embedded.port, user="postgres", database="postgres",
                              password="guess")
    conn = await asyncpg.connect(embedded.dsn)  # the holder of the superuser's password gets in
    try:
        assert await conn.fetchval("SELECT rolpassword LIKE 'SCRAM-SHA-256$%' FROM pg_authid "
                                   "WHERE rolname = 'postgres'")
    finally:
        await conn.close()
    socket_file = embedded.data_dir / f".s.PGSQL.{embedded.port}"
    assert stat.S_IMODE(socket_file.stat().st_mode) == 0o700  # the trusted socket: the server's OS user only
    secret = embedded.data_dir / "credentials" / "pg-superuser.pgpass"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600


def test_a_data_directory_made_with_trust_auth_asks_for_passwords_after_a_restart(embedded: PostgresServer) -> None:
    """A data directory from before (initdb --auth=trust) is brought up to date at its next start."""
    embedded.stop()
    hba = embedded.data_dir / "pgdata" / "pg_hba.conf"
    hba.write_text("local all all trust\nhost all all 127.0.0.1/32 trust\n")
    password = embedded.password
    embedded.start()
    assert "trust" not in [line.split()[-1] for line in hba.read_text().splitlines() if line.startswith("host")]
    assert embedded.password == password  # kept across restarts: DSNs handed out stay valid
    with pytest.raises(asyncpg.InvalidPasswordError):
        asyncio.run(asyncpg.connect(host=embedded.host, port=embedded.port, user="postgres", database="postgres",
                                    password="", passfile="/nonexistent"))


async def test_provisioned_logins_append_read_and_nothing_more(postgres_dsn: str, tmp_path: Path) -> None:
    logins = pglogins.provision_async(postgres_dsn, tmp_path, SERVICES)
    provisioned = await logins
    assert provisioned is not None
    for dsn in provisioned.dsns.values():
        parts = urlsplit(dsn)
        assert parts.password is None and "passfile=" in parts.query  # the secret stays in its file
        passfile = Path(parts.query.split("passfile=")[1])
        assert stat.S_IMODE(passfile.stat().st_mode) == 0o600
    # a service opens the migrated store without DDL rights, appends (hash chain, allocations trigger,
    # tracking, relay position: everything an append and a relay touch) and reads
    store = await EventStore.open(provisioned.service("admission"), pool_size=1)
    try:
        event = NewEvent(event_id="e1", stream="job-j1", type="JobSubmitted", schema_version=1,
                         data=b'{"user": "alice"}', correlation_id=None, causation_id=None,
                         occurred_at=datetime.now(UTC))
        await store.append("job-j1", 0, [event], tracking=Tracking("admission-inbox", "m1"))
        await store.save_relay_position("relay", 1)
        await store.save_checkpoint("admission", 1)
    finally:
        await store.close()
    conn = await asyncpg.connect(provisioned.service("admission"))
    try:
        assert not await conn.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("UPDATE events SET type = 'x'")
    finally:
        await conn.close()
    reader = await EventStore.open(provisioned.reader, pool_size=1)
    try:
        assert await reader.head_position() == 1
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await reader.save_checkpoint("cli", 1)
    finally:
        await reader.close()


async def test_passwords_are_kept_across_starts_and_a_deleted_file_rotates_one(postgres_dsn: str,
                                                                              tmp_path: Path) -> None:
    first = await pglogins.provision_async(postgres_dsn, tmp_path, SERVICES)
    assert first is not None
    quota_file = tmp_path / "credentials" / "pg-quota.pgpass"
    kept = (tmp_path / "credentials" / "pg-admission.pgpass").read_text()
    old_quota = quota_file.read_text()
    quota_file.unlink()
    second = await pglogins.provision_async(postgres_dsn, tmp_path, SERVICES)
    assert second is not None and second.dsns == first.dsns
    assert (tmp_path / "credentials" / "pg-admission.pgpass").read_text() == kept
    assert quota_file.read_text() != old_quota
    (await asyncpg.connect(second.service("quota"))).terminate()  # the new password works
    old_password = old_quota.strip().rsplit(":", 1)[1]
    parts = urlsplit(postgres_dsn)
    with pytest.raises(asyncpg.InvalidPasswordError):  # ... and the old one no longer does
        await asyncpg.connect(host=parts.hostname, port=parts.port, database=parts.path.lstrip("/"),
                              user=old_quota.split(":")[3], password=old_password)


async def test_a_login_of_another_installation_cannot_connect_here(postgres_dsn: str, tmp_path: Path) -> None:
    here = await pglogins.provision_async(postgres_dsn, tmp_path / "a", SERVICES)
    other_db = postgres_dsn.rpartition("/")[2] + "_other"
    admin = await asyncpg.connect(postgres_dsn)
    await admin.execute(f'CREATE DATABASE "{other_db}"')
    await admin.close()
    try:
        other = await pglogins.provision_async(postgres_dsn.rpartition("/")[0] + "/" + other_db, tmp_path / "b",
                                               SERVICES)
        assert here is not None and other is not None
        stolen = other.service("admission")
        parts = urlsplit(stolen)
        with pytest.raises(asyncpg.InsufficientPrivilegeError):  # no CONNECT on this database
            await asyncpg.connect(urlunsplit(parts._replace(path=urlsplit(postgres_dsn).path)))
    finally:
        admin = await asyncpg.connect(postgres_dsn)
        await admin.execute(f'DROP DATABASE IF EXISTS "{other_db}" WITH (FORCE)')
        await admin.close()


async def test_a_service_login_cannot_apply_pending_migrations_and_says_who_does(postgres_dsn: str,
                                                                                 tmp_path: Path) -> None:
    logins = await pglogins.provision_async(postgres_dsn, tmp_path, SERVICES)
    assert logins is not None
    admin = await asyncpg.connect(postgres_dsn)
    await admin.execute("DELETE FROM schema_migrations WHERE name = '051_hash_chain.sql'")  # as if new
    await admin.close()
    with pytest.raises(MigrationError, match=r"may not apply them.*corral up"):
        await EventStore.open(logins.service("placement"), pool_size=1)


def test_login_names_are_scoped_by_database_and_fit_postgres() -> None:
    assert pglogins.login_name("corral", "placement") == "corral_svc_placement"
    assert pglogins.login_name("corral", pglogins.READER) == "corral_cli"
    long = pglogins.login_name("x" * 80, "preemption")
    assert len(long) <= 63 and long != pglogins.login_name("x" * 79 + "y", "preemption")
