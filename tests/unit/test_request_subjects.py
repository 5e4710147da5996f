"""Which subject the client publishes each request on: the one naming its identity, an admin's
admin subject for what an admin does, the bare subject only without any identity."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from corral.client import Client
from corral.contracts import events as ev
from corral.contracts.envelope import job_stream
from corral.stack.context import Context


def _client(tmp_path: Path, *, role: str | None = None, url: str = "tls://127.0.0.1:4222") -> Client:
    creds = None
    if role is not None:
        path = tmp_path / f"{role}.json"
        path.write_text(json.dumps({"user": "root" if role == "admin" else "bob", "password": "x", "role": role}))
        creds = str(path)
    ctx = Context(nats_url=url, postgres_dsn="postgresql://x@127.0.0.1/corral", namespace="corral", credentials=creds)
    store: Any = None
    return Client(ctx, store, None)


def _requests() -> dict[str, ev.Event]:
    common: dict[str, Any] = {"stream": job_stream("j1"), "actor": "user/x", "job_id": "j1", "user": "x"}
    return {"cancel": ev.JobCancelRequested.new(**common),
            "drain": ev.NodeDrained.new(stream="node-n0", actor="user/x", node="n0", user="x")}


def test_each_identity_names_itself(tmp_path: Path) -> None:
    cancel, drain = _requests()["cancel"], _requests()["drain"]
    admin = _client(tmp_path, role="admin")
    assert admin._request_subject(cancel) == "corral.inbox.admin.root.JobCancelRequested"
    assert admin._request_subject(drain) == "corral.inbox.admin.root.NodeDrained"
    bob = _client(tmp_path, role="submitter")
    assert bob._request_subject(cancel) == "corral.inbox.user.bob.JobCancelRequested"
    assert bob._request_subject(drain) == "corral.inbox.admin.bob.NodeDrained"  # NATS refuses it: not an admin
    # no credentials file (an open bus, the test suite's superuser in its URL): the bare subject,
    # which only a superuser may publish; an admin's URL alone is not enough (deploy/README.md)
    assert _client(tmp_path)._request_subject(cancel) == "corral.inbox.JobCancelRequested"
    url = _client(tmp_path, url="nats://corral-test:pw@127.0.0.1:4222")
    assert url.identity is None and url._request_subject(drain) == "corral.inbox.NodeDrained"
