"""`corral user` when the cluster's Postgres cannot be reached: nothing changes, and it says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.stack import credentials, people_admin, pglogins
from corral.stack.people import Kind, PeopleError
from corral.stack.people_admin import Installation
from corral.stack.servers import free_port


def test_an_unreachable_postgres_changes_nothing(tmp_path: Path) -> None:
    inst = Installation(tmp_path, "corral")
    people_admin.prepare(inst, [], "root")
    credentials.write_private(inst.keys / pglogins.OWNER_DSN_FILE,
                              f"postgresql://postgres:x@127.0.0.1:{free_port()}/corral\n")
    before = inst.registry_file.read_text()
    with pytest.raises(PeopleError, match=r"cannot reach the cluster.s Postgres.*nothing changed"):
        people_admin.add(inst, "alice", Kind.PERSON, by="root")
    with pytest.raises(PeopleError, match="nothing changed"):
        people_admin.rotate(inst, "root", by="root")
    assert inst.registry_file.read_text() == before
    assert not inst.credentials_file("alice").exists()
    assert 'user: "alice"' not in inst.auth_file.read_text()
