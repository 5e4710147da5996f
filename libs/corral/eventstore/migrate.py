"""Applies the SQL migrations in `corral/eventstore/migrations/` once each, in order.

Why: every service opens the store at start, possibly several at the same moment on a fresh
database. A session advisory lock makes concurrent starters queue behind the first one, and the
`schema_migrations` table (name + checksum) makes a second run a no-op. Other components add their
tables by dropping a `NNN_name.sql` file into the same folder; files run sorted by number. Editing
a migration that was already applied is refused (checksum mismatch): write a new one instead.

Who migrates: the owner (superuser) only. `corral up` applies them as the owner before any service
starts (`corral.stack.pglogins`); a service or the CLI, connected with a login that may not run DDL,
opens the store with `migrate_if_needed`, which only reads `schema_migrations` when nothing is
pending (a login of `corral_service` / `corral_reader` may read it) and names the fix otherwise.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from corral.eventstore.errors import MigrationError

if TYPE_CHECKING:
    import asyncpg

MIGRATION_LOCK_KEY = 0x636F7272616C  # "corral" in ASCII; any constant bigint shared by all starters
_NAME = re.compile(r"^(\d+)_[A-Za-z0-9_]+\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    """One SQL file: `name` is the file name (its identity), `sql` its text."""

    name: str
    sql: str

    @property
    def number(self) -> int:
        match = _NAME.match(self.name)
        if match is None:
            raise MigrationError(f"migration file {self.name!r} must be named NNN_description.sql")
        return int(match.group(1))

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def bundled_migrations() -> list[Migration]:
    """Every `*.sql` file shipped in `corral.eventstore/migrations`, in number order."""
    from importlib import resources  # here: a reader lists the folder (`pending_names`) without it

    folder = resources.files("corral.eventstore") / "migrations"
    found = [Migration(entry.name, entry.read_text(encoding="utf-8"))
             for entry in folder.iterdir() if entry.name.endswith(".sql")]
    return ordered(found)


def ordered(migrations: Sequence[Migration]) -> list[Migration]:
    """Sort by number; two files with one number would apply in an arbitrary order, so refuse."""
    result = sorted(migrations, key=lambda m: (m.number, m.name))
    for before, after in itertools.pairwise(result):
        if before.number == after.number:
            raise MigrationError(f"migrations {before.name!r} and {after.name!r} share number "
                                 f"{before.number}; renumber one of them")
    return result


async def pending_migrations(conn: asyncpg.Connection,
                             migrations: Sequence[Migration] | None = None) -> list[Migration]:
    """What `apply_migrations` would apply, read without any lock or DDL; an applied file that was
    edited since is a MigrationError here too."""
    todo = ordered(migrations) if migrations is not None else bundled_migrations()
    if await conn.fetchval("SELECT to_regclass('schema_migrations')") is None:
        return todo
    applied = {row["name"]: row["checksum"] for row in await conn.fetch("SELECT name, checksum FROM schema_migrations")}
    for migration in todo:
        known = applied.get(migration.name)
        if known is not None and known != migration.checksum:
            raise MigrationError(f"migration {migration.name!r} changed after it was applied; "
                                 "revert the edit and add a new NNN_name.sql file instead")
    return [m for m in todo if m.name not in applied]


def bundled_names() -> list[str]:
    """The names of `bundled_migrations`, sorted, their files not read."""
    folder = os.path.join(os.path.dirname(__file__), "migrations")
    if os.path.isdir(folder):  # installed as files: listed without importlib.resources (~4% of `corral jobs`)
        return sorted(name for name in os.listdir(folder) if name.endswith(".sql"))
    from importlib import resources

    return sorted(entry.name for entry in (resources.files("corral.eventstore") / "migrations").iterdir()
                  if entry.name.endswith(".sql"))


async def pending_names(conn: asyncpg.Connection) -> list[str]:
    """The names of the bundled migrations not applied: a reader's check (the files are listed,
    not read; `pending_migrations`, which the owner's start runs, also finds an edited one)."""
    names = bundled_names()
    if await conn.fetchval("SELECT to_regclass('schema_migrations')") is None:
        return names
    applied = {row["name"] for row in await conn.fetch("SELECT name FROM schema_migrations")}
    return [name for name in names if name not in applied]


async def migrate_if_needed(conn: asyncpg.Connection) -> list[str]:
    """Apply pending migrations, if any; with nothing pending, only reads (a login without DDL
    rights opens the store of a migrated database). Pending migrations that this login may not
    apply are a MigrationError that says who applies them."""
    if not await pending_migrations(conn):
        return []
    import asyncpg

    try:
        return await apply_migrations(conn)
    except (MigrationError, asyncpg.InsufficientPrivilegeError) as exc:
        cause = exc if isinstance(exc, asyncpg.PostgresError) else exc.__cause__
        if not isinstance(cause, asyncpg.InsufficientPrivilegeError):
            raise
        user = await conn.fetchval("SELECT current_user")
        raise MigrationError(f"{exc}: migrations are pending and {user!r} may not apply them; the owner "
                             "applies them (`corral up` does at start, as the owner)") from exc


async def apply_migrations(conn: asyncpg.Connection,
                           migrations: Sequence[Migration] | None = None) -> list[str]:
    """Apply what is missing, each file in its own transaction; return the names applied now."""
    import asyncpg

    todo = ordered(migrations) if migrations is not None else bundled_migrations()
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
    try:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " name text PRIMARY KEY, checksum text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        rows = await conn.fetch("SELECT name, checksum FROM schema_migrations")
        applied = {row["name"]: row["checksum"] for row in rows}
        done: list[str] = []
        for migration in todo:
            known = applied.get(migration.name)
            if known is not None:
                if known != migration.checksum:
                    raise MigrationError(
                        f"migration {migration.name!r} changed after it was applied; "
                        "revert the edit and add a new NNN_name.sql file instead")
                continue
            try:
                async with conn.transaction():
                    await conn.execute(migration.sql)
                    await conn.execute("INSERT INTO schema_migrations (name, checksum) VALUES ($1, $2)",
                                       migration.name, migration.checksum)
            except asyncpg.PostgresError as exc:
                raise MigrationError(f"migration {migration.name!r} failed: {exc}") from exc
            done.append(migration.name)
        return done
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
