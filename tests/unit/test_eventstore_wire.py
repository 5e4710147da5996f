"""The blocking Postgres reader's pure parts: a DSN as libpq reads it, the password file, SCRAM,
values in Postgres' text forms. Its reads against a real server: tests/integration/test_wire.py."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.eventstore import wire


def test_scram_sha_256_answers_as_rfc_7677_says() -> None:
    scram = wire._Scram("pencil", user="user", nonce="rOprNGfwEbeRWgbNEkqO")
    assert scram.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    final = scram.final(b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    assert final == (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                     b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    scram.check(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
    with pytest.raises(wire.PostgresError):
        scram.check(b"v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")


def test_a_nonce_the_server_did_not_extend_is_refused() -> None:
    scram = wire._Scram("pencil", nonce="abc")
    with pytest.raises(wire.PostgresError):
        scram.final(b"r=other,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")


def test_the_dsn_of_corral_up_and_a_persons_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PGHOST", "PGPORT", "PGUSER", "PGPASSWORD", "PGDATABASE", "PGSSLMODE", "PGPASSFILE"):
        monkeypatch.delenv(name, raising=False)
    passfile = tmp_path / "pg.pgpass"
    passfile.write_text("# a comment\nother:*:*:*:no\n*:*:*:corral_cli:s\\:cret\n")
    target = wire.Target.of(f"postgresql://corral_cli@127.0.0.1:49807/corral?passfile={passfile}", 5.0)
    assert (target.host, target.port, target.user, target.database, target.password, target.sslmode) == (
        "127.0.0.1", 49807, "corral_cli", "corral", "s:cret", "prefer")
    person = wire.Target.of("postgresql://corral_u_bob:p%40ss@db.example:5433/corral?sslmode=verify-full", 5.0)
    assert (person.user, person.password, person.sslmode, person.port) == ("corral_u_bob", "p@ss", "verify-full", 5433)


@pytest.mark.parametrize("dsn", [
    "postgresql://a@h1,h2/db",  # several hosts
    "postgresql://a@h/db?target_session_attrs=read-write",  # an option not read here
    "postgresql://a@h/db?sslmode=gssapi",
    "mysql://a@h/db",
])
def test_what_this_reader_does_not_speak_is_left_to_asyncpg(dsn: str) -> None:
    with pytest.raises(wire.Unsupported):
        wire.Target.of(dsn, 5.0)


@given(st.lists(st.one_of(st.none(), st.text(alphabet=st.characters(blacklist_categories=["Cs"],
                                                                      blacklist_characters="\0")))))
def test_a_text_array_parameter_reads_back_as_sent(items: list[str | None]) -> None:
    encoded = wire._encode(items)
    assert encoded is not None
    assert wire._decode_array(encoded.decode(), str) == items


def test_values_in_their_text_forms() -> None:
    assert wire._encode(None) is None and wire._encode(True) == b"t" and wire._encode(5) == b"5"
    assert wire._encode(b"\x00\xff") == b"\\x00ff" and wire._bytea("\\x00ff") == b"\x00\xff"
    assert wire._timestamp("2026-12-07 06:02:11.5+00") == datetime(2026, 12, 7, 6, 2, 11, 500000, tzinfo=UTC)
    assert wire._decode_array('{1,2,NULL}', int) == [1, 2, None]
    with pytest.raises(wire.Unsupported):
        wire._encode(object())


def test_a_coroutine_that_suspends_is_refused() -> None:
    import asyncio

    async def waits() -> None:
        await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="suspends"):
        wire.finish(waits())


def test_a_reader_lists_the_migrations_the_owner_applies() -> None:
    from corral.eventstore.migrate import bundled_migrations, bundled_names

    assert bundled_names() == sorted(m.name for m in bundled_migrations())
