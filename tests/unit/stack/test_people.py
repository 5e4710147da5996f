"""The people registry and the bus authorization made from it (pure parts)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.bus import auth
from corral.stack.context import Context, redacted, resolve, with_password
from corral.stack.people import Kind, PeopleError, Person, Registry, check_name, identities, identity
from corral.stack.pglogins import person_login, person_prefix

names = st.from_regex(r"[a-z][a-z0-9_-]{0,31}", fullmatch=True).filter(lambda n: not n.startswith(("svc-", "agent-")))
kinds = st.sampled_from(list(Kind))


def _person(name: str, kind: Kind = Kind.PERSON) -> Person:
    return Person(name, kind, created="2026-12-07T00:00:00+00:00", added_by="root")


@given(st.lists(st.tuples(names, kinds), max_size=12))
def test_a_registry_holds_each_login_once_and_round_trips_through_its_text(entries: list[tuple[str, Kind]]) -> None:
    registry = Registry()
    for name, kind in entries:
        try:
            registry = registry.add(_person(name, kind))
        except PeopleError:
            assert any(n.replace("-", "_") == name.replace("-", "_") for n in registry.names())
    keys = [n.replace("-", "_") for n in registry.names()]
    assert len(keys) == len(set(keys))
    assert Registry.from_json(registry.to_json()) == registry
    for name in registry.names():
        assert name not in registry.remove(name).names()


def test_names_are_unix_like_and_never_the_installations_own() -> None:
    assert check_name("alice") == "alice"
    for bad in ("Alice", "9lives", "a.b", "a b", "", "x" * 33, "svc-admission", "agent-node-0", "corral-test"):
        with pytest.raises(PeopleError):
            check_name(bad)
    with pytest.raises(PeopleError, match="already a user"):
        Registry().add(_person("bob")).add(_person("bob", Kind.ADMIN))
    with pytest.raises(PeopleError, match="share a Postgres login"):
        Registry().add(_person("ci-x")).add(_person("ci_x"))
    with pytest.raises(PeopleError, match="no user"):
        Registry().remove("nobody-here")
    # the operator's entry keeps what `$USER` gave (an upper-case name), but no reserved one
    assert Registry().add(_person("Root", Kind.ADMIN)).admins() == ["Root"]
    with pytest.raises(PeopleError):
        Registry().add(_person("svc-quota"))


@pytest.mark.parametrize("text", ["{bad", "[]", '{"version": 1, "people": [{"kind": "person"}]}',
                                  '{"version": 1, "people": [{"name": "ann", "kind": "wizard"}]}',
                                  '{"version": 1, "people": ["ann"]}'])
def test_a_registry_that_is_not_one_is_a_people_error(text: str) -> None:
    """A hand-edited registry is a PeopleError (the CLI's one line), never a traceback."""
    with pytest.raises(PeopleError, match="registry"):
        Registry.from_json(text)


def test_ensure_keeps_an_existing_entry_whatever_its_kind() -> None:
    registry = Registry().add(_person("bob", Kind.ADMIN))
    assert registry.ensure(_person("bob")) is registry
    assert registry.ensure(_person("carol")).get("carol") == _person("carol")


def test_each_kind_gets_the_rights_of_its_role() -> None:
    alice, ci, ops = _person("alice"), _person("ci", Kind.PIPELINE), _person("ops", Kind.ADMIN)
    assert identity("corral", alice, "pw").role is auth.Role.SUBMITTER
    assert identity("corral", ci, "pw").publish == identity("corral", _person("ci"), "pw").publish
    assert identity("corral", ops, "pw").role is auth.Role.ADMIN
    listed = list(identities("corral", Registry((alice, ci, ops)), {"alice": "a", "ops": "o"}))
    assert [i.user for i in listed] == ["alice", "ops"]


def test_the_authorization_names_every_person_once_with_their_secret() -> None:
    registry = Registry((_person("alice"), _person("ci", Kind.PIPELINE)))
    text = auth.nats_authorization(identities("corral", registry, {"alice": "s3cret-a", "ci": "s3cret-c"}))
    assert text.count('user: "alice"') == 1 and '"s3cret-a"' in text and '"s3cret-c"' in text
    assert '"corral.inbox.user.alice.JobSubmitted"' in text
    assert '"corral.inbox.user.ci.JobSubmitted"' in text


def test_person_logins_carry_the_database_and_fit_postgres() -> None:
    assert person_login("corral", "alice") == "corral_u_alice"
    assert person_login("corral", "ci-nightly") == "corral_u_ci_nightly"
    long = "d" * 60
    assert person_login(long, "x" * 32).startswith(person_prefix(long)) and len(person_login(long, "x" * 32)) <= 63


def test_a_person_context_carries_its_secrets_and_the_dsn_gets_the_password_in_memory_only(tmp_path) -> None:
    path = tmp_path / "alice.json"
    path.write_text(json.dumps({
        "nats_url": "tls://h:4222", "postgres_dsn": "postgresql://corral_u_alice@h:5432/corral", "namespace": "corral",
        "nats_identity": {"user": "alice", "password": "pw", "role": "submitter", "kind": "person"},
        "nats_ca_pem": "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n", "postgres_password": "pg/pw"}))
    ctx = resolve(context_path=path)
    assert ctx.credentials == str(path) and ctx.nats_ca is not None and ctx.nats_ca.startswith("-----BEGIN")
    assert ctx.postgres_dsn == "postgresql://corral_u_alice:pg%2Fpw@h:5432/corral"
    assert redacted(ctx.postgres_dsn) == "postgresql://corral_u_alice:***@h:5432/corral"
    assert Context.load(path).postgres_dsn == "postgresql://corral_u_alice@h:5432/corral"
    assert with_password("postgresql://u:already@h/db", "x") == "postgresql://u:already@h/db"
