"""Adding, removing and rotating people on a running installation, without restarting the bus.

Why: a site gives each person and pipeline an identity of their own (`corral.stack.people`), and
does so while jobs run. What `corral user add|remove|rotate` changes, all in the data folder of
`corral up` (so only its operator, who can read `credentials/`, may run them):
- `people.json`, the registry (kept across restarts of `corral up`, which reads it at start);
- the person's NATS credentials file `credentials/<name>.json` (0600), and the bus's
  authorization, `nats/auth.conf`: the installation's own identities (`credentials/
  bus-identities.json`, written by `corral up`) plus one per person; the nats-server includes it
  and re-reads it on SIGHUP (`corral.stack.servers.reload_nats`). A reload keeps every other
  connection and closes those whose user is gone or whose password changed;
- the person's Postgres login `<db>_u_<name>` in `corral_person` (`corral.stack.pglogins`),
  created with the owner's DSN `corral up` keeps in `credentials/pg-owner.dsn`;
- a context file for the person (`person_context`): everything their CLI needs, in one file;
- the log: each change is an event on stream `people` (UserAdded, UserRemoved,
  UserCredentialsRotated) with the admin as actor, appended with the owner's DSN (`record`):
  the change is the operator's, made in their files, and no service decides anything about it.

Concurrent changes are serialized by an exclusive lock on `people.lock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import asyncpg

from corral.bus import auth
from corral.contracts import events as ev
from corral.contracts.registry import encode
from corral.eventstore.records import ANY, NewEvent
from corral.eventstore.store import EventStore
from corral.stack import credentials, pglogins
from corral.stack.people import REGISTRY_FILE, Kind, PeopleError, Person, Registry, check_name, identity
from corral.stack.servers import reload_nats

#: The bus's authorization, included by `nats/nats.conf` (`NatsServer.authorization_include`).
AUTH_FILE = "auth.conf"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Installation:
    """The data folder of one `corral up`, as its operator sees it."""

    data_dir: Path
    namespace: str

    @property
    def keys(self) -> Path:
        return self.data_dir / "credentials"

    @property
    def registry_file(self) -> Path:
        return self.data_dir / REGISTRY_FILE

    @property
    def auth_file(self) -> Path:
        return self.data_dir / "nats" / AUTH_FILE

    def ensure_keys(self) -> None:
        """The credentials folder, mode 0700."""
        self.keys.mkdir(parents=True, exist_ok=True)
        os.chmod(self.keys, 0o700)

    def credentials_file(self, name: str) -> Path:
        return self.keys / f"{name}.json"

    # ---- registry ------------------------------------------------------------------------------
    def load(self) -> Registry:
        try:
            text = self.registry_file.read_text()
        except FileNotFoundError:
            return Registry()
        try:
            return Registry.from_json(text)
        except PeopleError as exc:
            raise PeopleError(f"{self.registry_file}: {exc}") from None

    def save(self, registry: Registry) -> None:
        credentials.write_private(self.registry_file, registry.to_json())

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """One change at a time (two `corral user` commands, or one and a starting `corral up`)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with (self.data_dir / "people.lock").open("a") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    # ---- NATS ----------------------------------------------------------------------------------
    def person_identity(self, person: Person, *, rotate: bool = False) -> auth.Identity:
        """`person`'s identity with their stored secret (a new one with `rotate`, or if none),
        written to their credentials file (0600)."""
        path = self.credentials_file(person.name)
        password = credentials.new_secret() if rotate else _stored_password(path)
        ident = identity(self.namespace, person, password)
        self.ensure_keys()
        raw = json.loads(ident.credentials_json())
        credentials.write_private(path, json.dumps({**raw, "kind": person.kind.value}, indent=2) + "\n")
        return ident

    def authorization(self, registry: Registry, system: Sequence[auth.Identity] | None = None) -> str:
        """The bus's `authorization` block: the installation's own identities and every person's."""
        if system is None:
            system = credentials.load_identities(self.keys / credentials.SYSTEM_IDENTITIES)
        return auth.nats_authorization([*system, *(self.person_identity(p) for p in registry.people)])

    def write_authorization(self, registry: Registry, system: Sequence[auth.Identity] | None = None) -> None:
        self.auth_file.parent.mkdir(parents=True, exist_ok=True)
        credentials.write_private(self.auth_file, self.authorization(registry, system))

    def apply_bus(self, registry: Registry) -> bool:
        """Rewrite the authorization and make the running nats-server read it (False: none runs;
        it reads the file when `corral up` starts it)."""
        if not (self.keys / credentials.SYSTEM_IDENTITIES).is_file():
            raise PeopleError(f"{self.data_dir} has no bus identities ({credentials.SYSTEM_IDENTITIES}): its NATS is "
                              "not one `corral up` runs; give people identities on that NATS with its own "
                              "configuration (`corral credentials`)")
        self.write_authorization(registry)
        return reload_nats(self.data_dir / "nats")

    # ---- Postgres ------------------------------------------------------------------------------
    def owner_dsn(self) -> str | None:
        """The owner's DSN `corral up` keeps when it created the logins (None: it could not)."""
        try:
            return (self.keys / pglogins.OWNER_DSN_FILE).read_text().strip() or None
        except FileNotFoundError:
            return None


def _stored_password(path: Path) -> str:
    try:
        return str(json.loads(path.read_text())["password"])
    except (OSError, ValueError, KeyError):
        return credentials.new_secret()


def prepare(inst: Installation, system: Sequence[auth.Identity], operator: str,
            submitters: Sequence[str] = ()) -> Registry:
    """At `corral up`: the registry with its operator (an admin) and `submitters` (people) in it,
    the installation's own identities saved, and the bus's authorization written."""
    with inst.locked():
        registry = inst.load().ensure(Person(operator, Kind.ADMIN, created=now(), added_by=operator))
        for name in submitters:
            registry = registry.ensure(Person(name, Kind.PERSON, created=now(), added_by=operator))
        inst.save(registry)
        inst.ensure_keys()
        credentials.save_identities(inst.keys / credentials.SYSTEM_IDENTITIES, system)
        inst.write_authorization(registry, system)
        return registry


@dataclass(frozen=True)
class Change:
    """What a `corral user` command did."""

    person: Person
    #: The bus re-read its authorization (False: no nats-server runs now; it will at start).
    reloaded: bool
    #: The person's Postgres login, when the installation has per-person logins.
    login: pglogins.PersonLogin | None
    identity: auth.Identity | None


def add(inst: Installation, name: str, kind: Kind, by: str) -> Change:
    check_name(name)
    with inst.locked():
        registry = inst.load()
        person = Person(name, kind, created=now(), added_by=by)
        registry = registry.add(person)
        login = _login(inst, name, rotate=True)
        ident = inst.person_identity(person, rotate=True)
        inst.save(registry)
        reloaded = inst.apply_bus(registry)
        record(inst, ev.UserAdded, by, user=name, kind=kind.value)
    return Change(person, reloaded, login, ident)


def remove(inst: Installation, name: str, by: str) -> Change:
    with inst.locked():
        registry = inst.load()
        person = registry.get(name)
        if person is None:
            raise PeopleError(f"no user {name!r} (see `corral user list`)")
        if name == by:
            raise PeopleError(f"{name!r} is the operator running this command (`corral up` puts them back at its "
                              "next start): remove another user")
        if person.kind is Kind.ADMIN and len(registry.admins()) == 1:
            raise PeopleError(f"{name!r} is the last admin: add another (`corral user add NAME --admin`) first")
        registry = registry.remove(name)
        inst.save(registry)
        reloaded = inst.apply_bus(registry)
        inst.credentials_file(name).unlink(missing_ok=True)
        owner = inst.owner_dsn()
        if owner is not None:
            _postgres(lambda: pglogins.drop_person(owner, inst.data_dir, name),
                      f"{name} can no longer use the bus, but their Postgres login is not dropped yet (the next "
                      "`corral up` drops it)")
        record(inst, ev.UserRemoved, by, user=name)
    return Change(person, reloaded, None, None)


def rotate(inst: Installation, name: str, by: str) -> Change:
    with inst.locked():
        registry = inst.load()
        if registry.get(name) is None:
            raise PeopleError(f"no user {name!r} (see `corral user list`)")
        registry = registry.rotated(name, now())
        person = registry.get(name)
        assert person is not None
        login = _login(inst, name, rotate=True)
        ident = inst.person_identity(person, rotate=True)
        inst.save(registry)
        reloaded = inst.apply_bus(registry)
        record(inst, ev.UserCredentialsRotated, by, user=name)
    return Change(person, reloaded, login, ident)


#: The log's stream of the people registry's changes.
PEOPLE_STREAM = "people"


def record(inst: Installation, event: type[ev.Event], actor: str, **payload: Any) -> bool:
    """Append what `corral user` did to the log, as the owner (stream `people`, `actor` the admin);
    False when the installation keeps no owner's DSN (no per-person logins: nothing to write with)."""
    owner = inst.owner_dsn()
    if owner is None:
        return False
    made = event.new(stream=PEOPLE_STREAM, actor=f"admin/{actor}", **payload)

    async def append() -> None:
        store = await EventStore.open(owner, pool_size=1, min_size=1)
        try:
            await store.append(PEOPLE_STREAM, ANY, [NewEvent(
                event_id=made.event_id, stream=made.stream, type=made.type, schema_version=made.schema_version,
                data=encode(made), correlation_id=made.correlation_id, causation_id=made.causation_id,
                occurred_at=made.occurred_at)])
        finally:
            await store.close()

    _postgres(append, f"the change is made, but not recorded in the log ({made.type} of {payload.get('user')})")
    return True


def _login(inst: Installation, name: str, *, rotate: bool) -> pglogins.PersonLogin | None:
    """`name`'s Postgres login, made first: when the database cannot be reached nothing else changes."""
    owner = inst.owner_dsn()
    if owner is None:
        return None
    return _postgres(lambda: pglogins.ensure_person(owner, inst.data_dir, name, rotate=rotate),
                     "nothing changed")


T = TypeVar("T")


def _postgres(work: Callable[[], Coroutine[Any, Any, T]], consequence: str) -> T:
    """Run `work` against the installation's Postgres; unreachable, a PeopleError saying what it means."""
    try:
        return asyncio.run(work())
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise PeopleError(f"cannot reach the cluster's Postgres ({type(exc).__name__}: {exc}): {consequence}; "
                          "is `corral up` running?") from exc


def person_context(*, nats_url: str, namespace: str, ident: auth.Identity, kind: Kind,
                   ca_file: str | None, postgres_dsn: str, login: pglogins.PersonLogin | None) -> dict[str, Any]:
    """The context file of one person (`corral.stack.context.Context`): the cluster's addresses,
    their NATS identity, the CA that verifies the bus, and their own Postgres login, embedded so
    that one file (mode 0600) is all they need. Without per-person logins, the installation's
    read-only DSN (it names a password file only the operator can read)."""
    return {
        "nats_url": nats_url,
        "postgres_dsn": login.dsn if login is not None else postgres_dsn,
        "namespace": namespace,
        "nats_identity": {**json.loads(ident.credentials_json()), "kind": kind.value},
        "nats_ca_pem": Path(ca_file).read_text() if ca_file else None,
        "postgres_password": login.password if login is not None else None,
    }
