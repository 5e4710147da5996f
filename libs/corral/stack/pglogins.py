"""The Postgres logins of one installation: one per service, one read-only for the CLI.

Why: the services connected as the superuser `postgres`, so any of them (or anyone holding its
DSN) could bypass the append-only trigger (`SET session_replication_role = replica`, `ALTER TABLE
events DISABLE TRIGGER`), rewrite or delete events, or run OS commands (`COPY ... TO PROGRAM`).
Migration 050 made the roles (`corral_service`, `corral_reader`); this module gives each process a
login in one of them. `corral up` holds the owner's DSN (the superuser of its embedded Postgres,
or the DSN it was given) and, before any service starts:
- applies the migrations as the owner (the services then find nothing to apply: they never run DDL);
- creates or updates one login per service, IN ROLE corral_service (`<db>_svc_admission`,
  `_quota`, `_placement`, `_preemption`; a placement standby shares placement's login), and one
  for the CLI and auditors, IN ROLE corral_reader (`<db>_cli`). Names carry the database name:
  roles are cluster-wide, and two installations on one server must not share (or overwrite) logins;
- stores each password in a libpq password file, `<data_dir>/credentials/pg-<component>.pgpass`
  (mode 0600), kept across restarts and applied again at every start (deleting a file and
  restarting rotates that password);
- lets only these logins (and superusers) connect to the database (`REVOKE CONNECT ... FROM
  PUBLIC`): a login of another installation on the same server cannot reach this one's log.
Each DSN names its password file (`?passfile=...`), never the password.

When the owner's DSN may not create roles (neither superuser nor CREATEROLE), nothing is
provisioned and every process uses that DSN as before (`provision` returns None).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import re
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

import asyncpg

from corral.eventstore.migrate import apply_migrations
from corral.stack import credentials

#: The login of the CLI and of auditors (`corral audit verify`, `corral events --export`).
READER = "cli"
SERVICE_ROLE = "corral_service"
READER_ROLE = "corral_reader"
#: The group of every person's and pipeline's own login (migration 075).
PERSON_ROLE = "corral_person"
#: Where a person's login finds the tables it reads before `public` (its `events` hides others' env values).
PERSON_SCHEMA = "person_view"
#: Where `corral up` keeps the owner's DSN, for `corral user` to create and drop people's logins.
OWNER_DSN_FILE = "pg-owner.dsn"

T = TypeVar("T")


def login_name(database: str, component: str) -> str:
    """`<database>_svc_<service>` or `<database>_cli`: lower-case letters, digits and `_`, at most
    63 characters (Postgres truncates longer names silently: a long database name is hashed)."""
    prefix = re.sub(r"[^a-z0-9_]", "_", database.lower())
    suffix = READER if component == READER else f"svc_{re.sub(r'[^a-z0-9_]', '_', component.lower())}"
    if len(prefix) + 1 + len(suffix) > 63:
        prefix = prefix[:20] + "_" + hashlib.sha256(database.encode()).hexdigest()[:10]
    return f"{prefix}_{suffix}"


def person_prefix(database: str) -> str:
    """`<database>_u_`, the start of every person's login of this database (a database name over
    28 characters is shortened with its hash, so that a 32-character person's name fits in 63)."""
    prefix = re.sub(r"[^a-z0-9_]", "_", database.lower())
    if len(prefix) > 28:
        prefix = prefix[:17] + "_" + hashlib.sha256(database.encode()).hexdigest()[:10]
    return f"{prefix}_u_"


def person_login(database: str, name: str) -> str:
    """`<database>_u_<name>`: a person's or pipeline's own login."""
    return person_prefix(database) + re.sub(r"[^a-z0-9_]", "_", name.lower())


def person_pgpass(data_dir: Path, name: str) -> Path:
    return data_dir / "credentials" / f"pg-u-{name}.pgpass"


def with_login(dsn: str, user: str, passfile: Path | None) -> str:
    """`dsn` with `user` as its user, no password, and `passfile` (if any) as its password file."""
    parts = urlsplit(dsn)
    host = parts.hostname or "127.0.0.1"
    netloc = f"{quote(user)}@{'[' + host + ']' if ':' in host else host}" + (f":{parts.port}" if parts.port else "")
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in ("user", "password", "passfile")]
    if passfile is not None:
        query.append(("passfile", str(passfile)))
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query, safe="/", quote_via=quote), ""))


def login_of(dsn: str) -> str:
    return unquote(urlsplit(dsn).username or "")


def moved(dsn: str, host: str) -> str:
    """`dsn` pointing at `host` (`HOST` or `HOST:PORT`) instead: where the services reach the
    server may not be where the owner did (a port-forward, a cluster's service name)."""
    parts = urlsplit(dsn)
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit((parts.scheme, user + host, parts.path, parts.query, ""))


def with_stored_password(dsn: str) -> str:
    """`dsn` (a login's, naming its password file) with the password itself and no file: for a
    secret store that holds the whole DSN (a Kubernetes Secret)."""
    parts = urlsplit(dsn)
    query = dict(parse_qsl(parts.query))
    passfile = query.pop("passfile", None)
    user = login_of(dsn)
    password = credentials.pgpass_secret(Path(passfile), user) if passfile else ""
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{quote(user)}:{quote(password, safe='')}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(list(query.items()), safe="/", quote_via=quote), ""))


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class Logins:
    """The DSN each component connects with."""

    dsns: dict[str, str]

    def service(self, name: str) -> str:
        return self.dsns[name]

    @property
    def reader(self) -> str:
        return self.dsns[READER]


async def provision_async(owner_dsn: str, data_dir: Path, services: Sequence[str],
                          say: Callable[[str], None] = lambda message: None,
                          people: Sequence[str] = ()) -> Logins | None:
    """Migrate as the owner, then create or update every login (the services', the CLI's, and one
    per person of `people`); None when the owner may not."""
    conn = await asyncpg.connect(owner_dsn)
    try:
        await apply_migrations(conn)
        can = await conn.fetchval("SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user")
        if not can:
            say("postgres: the DSN's role may not create roles; every service connects with it "
                "(no per-service logins; see docs/security.md)")
            return None
        database = str(await conn.fetchval("SELECT current_database()"))
        directory = data_dir / "credentials"
        components = [(name, SERVICE_ROLE) for name in services] + [(READER, READER_ROLE)]
        dsns: dict[str, str] = {}
        async with conn.transaction():
            await conn.execute(f"REVOKE CONNECT, TEMPORARY ON DATABASE {_ident(database)} FROM PUBLIC")
            for component, group in components:
                login = login_name(database, component)
                path = directory / f"pg-{component}.pgpass"
                password = credentials.pgpass_secret(path, login)
                await _ensure_login(conn, login, password, group)
                await conn.execute(f"GRANT CONNECT ON DATABASE {_ident(database)} TO {_ident(login)}")
                credentials.write_pgpass(path, login, password)
                dsns[component] = with_login(owner_dsn, login, path)
            await sync_people(conn, data_dir, people)
        return Logins(dsns)
    finally:
        await conn.close()


async def _ensure_login(conn: Any, login: str, password: str, group: str) -> None:
    """CREATE or ALTER `login`: LOGIN with `password`, no special powers, member of `group` only."""
    powers = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS INHERIT"
    # A utility statement takes no parameters; the password is [A-Za-z0-9_-] (token_urlsafe).
    if not re.fullmatch(r"[A-Za-z0-9_-]+", password):
        raise ValueError("a Postgres login password must be [A-Za-z0-9_-]; delete its pgpass file to regenerate it")
    exists = await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", login)
    if not exists:
        try:
            async with conn.transaction():
                await conn.execute(f"CREATE ROLE {_ident(login)} {powers} PASSWORD '{password}'")
        except (asyncpg.DuplicateObjectError, asyncpg.UniqueViolationError):
            pass  # created meanwhile by another start on the same server
    await conn.execute(f"ALTER ROLE {_ident(login)} {powers} PASSWORD '{password}'")
    others = await conn.fetch(
        "SELECT g.rolname FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid "
        "JOIN pg_roles u ON u.oid = m.member WHERE u.rolname = $1 AND g.rolname <> $2", login, group)
    for row in others:  # a login in two groups would have both groups' rights
        await conn.execute(f"REVOKE {_ident(row['rolname'])} FROM {_ident(login)}")
    await conn.execute(f"GRANT {_ident(group)} TO {_ident(login)}")
    if group == PERSON_ROLE:  # a person reads the log through `person_view` (migration 072)
        await conn.execute(f"ALTER ROLE {_ident(login)} SET search_path TO {PERSON_SCHEMA}, public")


@dataclass(frozen=True)
class PersonLogin:
    """A person's Postgres login: its name, password and a DSN without any secret."""

    login: str
    password: str
    dsn: str


async def ensure_person(owner_dsn: str, data_dir: Path, name: str, *, rotate: bool = False) -> PersonLogin:
    """Create or update `name`'s login in `corral_person` (password kept in its pgpass file, or a
    new one with `rotate`: the old one is refused from then on)."""
    conn = await asyncpg.connect(owner_dsn)
    try:
        database = str(await conn.fetchval("SELECT current_database()"))
        login = person_login(database, name)
        path = person_pgpass(data_dir, name)
        password = credentials.new_secret() if rotate else credentials.pgpass_secret(path, login)
        async with conn.transaction():
            await _ensure_login(conn, login, password, PERSON_ROLE)
            await conn.execute(f"GRANT CONNECT ON DATABASE {_ident(database)} TO {_ident(login)}")
        credentials.write_pgpass(path, login, password)
        if rotate:  # sessions opened with the old password end too
            await conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", login)
        return PersonLogin(login, password, with_login(owner_dsn, login, None))
    finally:
        await conn.close()


async def drop_person(owner_dsn: str, data_dir: Path, name: str) -> None:
    """`name` may no longer log in: the login is disabled, its sessions ended, then dropped."""
    conn = await asyncpg.connect(owner_dsn)
    try:
        database = str(await conn.fetchval("SELECT current_database()"))
        await _drop_login(conn, database, person_login(database, name))
    finally:
        await conn.close()
    person_pgpass(data_dir, name).unlink(missing_ok=True)


async def _drop_login(conn: Any, database: str, login: str) -> None:
    if not await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", login):
        return
    await conn.execute(f"ALTER ROLE {_ident(login)} NOLOGIN")
    await conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", login)
    await conn.execute(f"REVOKE ALL ON DATABASE {_ident(database)} FROM {_ident(login)}")
    try:
        await conn.execute(f"DROP ROLE {_ident(login)}")
    except asyncpg.DependentObjectsStillReferencedError:
        pass  # it owns something after all: disabled (NOLOGIN) is what matters


async def sync_people(conn: Any, data_dir: Path, names: Sequence[str]) -> None:
    """At every start: each person's login (password from its pgpass file), and no login left in
    `corral_person` for someone no longer in the registry."""
    database = str(await conn.fetchval("SELECT current_database()"))
    wanted = {person_login(database, n): n for n in names}
    for login, name in wanted.items():
        path = person_pgpass(data_dir, name)
        password = credentials.pgpass_secret(path, login)
        await _ensure_login(conn, login, password, PERSON_ROLE)
        await conn.execute(f"GRANT CONNECT ON DATABASE {_ident(database)} TO {_ident(login)}")
        credentials.write_pgpass(path, login, password)
    prefix = person_prefix(database)
    members = await conn.fetch(
        "SELECT u.rolname FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid "
        "JOIN pg_roles u ON u.oid = m.member WHERE g.rolname = $1", PERSON_ROLE)
    for row in members:
        login = str(row["rolname"])
        if login.startswith(prefix) and login not in wanted:
            await _drop_login(conn, database, login)


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to completion from sync code, even when called inside a running event loop
    (an async test calls `Stack.start`): in a thread of its own, with its own loop."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def provision(owner_dsn: str, data_dir: Path, services: Sequence[str],
              say: Callable[[str], None] = lambda message: None, people: Sequence[str] = ()) -> Logins | None:
    """`provision_async` from sync code (`corral up`)."""
    return _run(provision_async(owner_dsn, data_dir, services, say, people))
