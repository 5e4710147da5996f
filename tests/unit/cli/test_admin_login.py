"""Admins' requests (drain, undrain, apply) from a submitter's login are refused before sending.

The review: NATS refuses a submitter's publish to an admin subject without telling the client,
so `corral drain` by bob waited out its 30 s retry window and ended in a traceback.
"""

from __future__ import annotations

from pathlib import Path

from corral.bus.auth import submitter
from corral.cli.session import admin_problem
from corral.stack.context import Context


def _ctx(tmp_path: Path, admin: bool | None) -> Context:
    creds = None
    if admin is not None:
        path = tmp_path / "me.json"
        path.write_text(submitter("corral", "bob", "secret-bob", admin=admin).credentials_json())
        creds = str(path)
    return Context(nats_url="nats://127.0.0.1:4222", postgres_dsn="postgresql://x@h/c", credentials=creds)


def test_a_submitters_login_is_told_it_needs_the_admins(tmp_path: Path) -> None:
    problem = admin_problem(_ctx(tmp_path, admin=False), "corral drain")
    assert problem is not None and "corral drain needs the admin's login" in problem
    assert "submitter `bob`" in problem and "CORRAL_CREDENTIALS" in problem


def test_an_admin_or_no_login_may_ask(tmp_path: Path) -> None:
    assert admin_problem(_ctx(tmp_path, admin=True), "corral drain") is None
    assert admin_problem(_ctx(tmp_path, admin=None), "corral apply") is None
