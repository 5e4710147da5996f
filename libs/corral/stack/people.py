"""The people of one installation: who may use it, as what (person, pipeline, admin), since when.

Why: every person and pipeline is a principal under its own name, so fair share by user, `corral
usage --by user` and "only the owner may cancel" mean something at a multi-user site. The
registry is the list the operator keeps with `corral user add|remove|rotate`
(`corral.stack.people_admin`); each entry becomes one NATS identity (`identity`), one credentials
file and one Postgres login of its own (`corral.stack.pglogins.person_login`).

Pure and I/O-free: the registry as a value, its JSON text, the rules for names, and the NATS
identities it yields. `corral.stack.people_admin` reads and writes `<data_dir>/people.json`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum

from corral.bus import auth

#: Where the registry lives: the data folder of `corral up`, beside `credentials/`.
REGISTRY_FILE = "people.json"

#: A person's name: a Unix-style account name (it is also a NATS subject token, the `user` of
#: their jobs, the OS account their jobs may run as, and part of their Postgres login).
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
#: Prefixes of the installation's own identities (`corral.bus.auth.service`, `.agent`).
_RESERVED_PREFIXES = ("svc-", "agent-")
_RESERVED = frozenset({"corral-test", "gateway"})
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class Kind(StrEnum):
    """What a principal is: a person at a terminal, a pipeline (a service account: CI, a workflow
    engine), or an admin (a person who may also configure queues and act on anyone's jobs)."""

    PERSON = "person"
    PIPELINE = "pipeline"
    ADMIN = "admin"


class PeopleError(ValueError):
    """A change the registry refuses; the message names the person and the fix."""


@dataclass(frozen=True)
class Person:
    name: str
    kind: Kind
    #: When the admin added them (ISO 8601, UTC).
    created: str
    #: Who added them (the admin's name), for the record.
    added_by: str = ""
    #: When their secret was last replaced (`corral user rotate`), ISO 8601; empty: never.
    rotated: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "kind": self.kind.value, "created": self.created,
                "added_by": self.added_by, "rotated": self.rotated}


def check_name(name: str) -> str:
    """`name` if it can be the name of a new person, else PeopleError saying what a name may be."""
    if not _NAME.match(name):
        raise PeopleError(f"user name {name!r}: use a lower-case letter, then lower-case letters, digits, '_' or "
                          "'-' (at most 32 characters), as for a Unix account")
    return _not_reserved(name)


def _not_reserved(name: str) -> str:
    """Any entry's name: a subject token that is not one of the installation's own identities (the
    operator's entry keeps whatever `corral.stack.credentials.admin_name` made of `$USER`)."""
    if not _TOKEN.match(name):
        raise PeopleError(f"user name {name!r}: use letters, digits, '_' or '-' (it is a NATS subject token)")
    if name in _RESERVED or name.startswith(_RESERVED_PREFIXES):
        raise PeopleError(f"user name {name!r} is reserved for the installation's own identities "
                          f"({', '.join(p + '...' for p in _RESERVED_PREFIXES)}): choose another")
    return name


def _login_key(name: str) -> str:
    """Two names that would share a Postgres login (`-` and `_` are the same there)."""
    return name.replace("-", "_").lower()


@dataclass(frozen=True)
class Registry:
    """Everyone who may use the installation, by name (at most one entry per name)."""

    people: tuple[Person, ...] = ()

    def get(self, name: str) -> Person | None:
        return next((p for p in self.people if p.name == name), None)

    def names(self) -> list[str]:
        return [p.name for p in self.people]

    def admins(self) -> list[str]:
        return [p.name for p in self.people if p.kind is Kind.ADMIN]

    def add(self, person: Person) -> Registry:
        _not_reserved(person.name)
        if self.get(person.name) is not None:
            raise PeopleError(f"{person.name!r} is already a user (`corral user rotate {person.name}` gives them "
                              "a new secret; `corral user remove` first to change their kind)")
        clash = next((p.name for p in self.people if _login_key(p.name) == _login_key(person.name)), None)
        if clash is not None:
            raise PeopleError(f"user name {person.name!r} would share a Postgres login with {clash!r} "
                              "('-' and '_' are the same there): choose another")
        return Registry((*self.people, person))

    def ensure(self, person: Person) -> Registry:
        """`person` added unless someone of that name is there already (whatever their kind)."""
        return self if self.get(person.name) is not None else self.add(person)

    def remove(self, name: str) -> Registry:
        if self.get(name) is None:
            raise PeopleError(f"no user {name!r} (see `corral user list`)")
        return Registry(tuple(p for p in self.people if p.name != name))

    def rotated(self, name: str, when: str) -> Registry:
        if self.get(name) is None:
            raise PeopleError(f"no user {name!r} (see `corral user list`)")
        return Registry(tuple(replace(p, rotated=when) if p.name == name else p for p in self.people))

    # ---- text ------------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps({"version": 1, "people": [p.as_dict() for p in self.people]}, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Registry:
        shape = "the people registry is not a version-1 registry ({\"version\": 1, \"people\": [...]})"
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise PeopleError(f"{shape}: {exc}") from None
        if not isinstance(raw, dict) or raw.get("version") != 1 or not isinstance(raw.get("people"), list):
            raise PeopleError(shape)
        registry = cls()
        for entry in raw["people"]:
            try:
                person = Person(name=str(entry["name"]), kind=Kind(entry["kind"]),
                                created=str(entry.get("created", "")), added_by=str(entry.get("added_by", "")),
                                rotated=str(entry.get("rotated", "")))
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise PeopleError(f"the people registry's entry {entry!r} is not a person "
                                  f"(name, kind: {', '.join(k.value for k in Kind)}): {exc!r}") from None
            registry = registry.add(person)
        return registry


def identity(namespace: str, person: Person, password: str) -> auth.Identity:
    """The NATS identity of `person`: a submitter, or an admin (`corral.bus.auth`). A pipeline's
    rights are a person's: submit, cancel and follow its own jobs."""
    return auth.submitter(namespace, person.name, password, admin=person.kind is Kind.ADMIN)


def identities(namespace: str, registry: Registry, passwords: dict[str, str]) -> Iterable[auth.Identity]:
    """One identity per person who has a password in `passwords` (by name)."""
    for person in registry.people:
        if person.name in passwords:
            yield identity(namespace, person, passwords[person.name])
