"""`corral logs`' reading of the rank files on this machine and of who this login reads as, and
`corral audit verify`'s answer when the log cannot be read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.cli.commands import CommandError, audit
from corral.cli.commands import logs as commands
from corral.cli.exit_codes import ExitCode
from corral.log_stream import LogQuery
from corral.stack.context import Context
from tests.unit.cli.commands.fakes import run


def context(tmp_path: Path, credentials: str | None = None) -> Context:
    return Context(nats_url="nats://127.0.0.1:1", postgres_dsn="", log_dir=str(tmp_path), credentials=credentials)


def test_the_rank_files_here_are_one_entry_per_attempt_and_rank(tmp_path: Path) -> None:
    folder = tmp_path / "workers" / "j1"
    folder.mkdir(parents=True)
    (folder / "rank-1.log").write_text("==== corral job j1 attempt 0 rank 1 ====\nb0\n")
    (folder / "rank-0.log").write_text("==== corral job j1 attempt 0 rank 0 ====\na0\n"
                                       "==== corral job j1 attempt 1 rank 0 ====\na1\n")
    entries = commands.local_entries(context(tmp_path), LogQuery("j1", None, None))
    assert [(e["attempt"], e["rank"], e["lines"][-1]) for e in entries] == [(0, 0, "a0"), (0, 1, "b0"), (1, 0, "a1")]
    only = commands.local_entries(context(tmp_path), LogQuery("j1", 1, 0))
    assert [(e["attempt"], e["rank"]) for e in only] == [(1, 0)] and only[0]["source"].endswith("rank-0.log")
    assert commands.local_entries(context(tmp_path), LogQuery("j2", None, None)) == []


def test_a_job_id_that_leaves_the_log_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CommandError):
        commands.local_entries(context(tmp_path), LogQuery("../x", None, None))


@pytest.mark.parametrize(("role", "reads_as"), [("person", "ann"), ("admin", None), ("", None)])
def test_a_person_reads_as_themselves_and_an_admin_reads_every_job(tmp_path: Path, role: str,
                                                                    reads_as: str | None) -> None:
    creds = tmp_path / "ann.json"
    creds.write_text(json.dumps({"user": "ann", "password": "p", "role": role, "inbox_prefix": "_INBOX.ann"}))
    assert commands.reader(context(tmp_path, str(creds))) == reads_as
    assert commands.reader(context(tmp_path)) is None


def test_an_audit_of_a_log_that_does_not_answer_is_exit_3() -> None:
    with pytest.raises(CommandError) as caught:
        run(audit.verify("postgresql://nobody@127.0.0.1:1/none?connect_timeout=1", 60))
    assert caught.value.code is ExitCode.NO_CLUSTER and "is `corral up` running?" in caught.value.message
