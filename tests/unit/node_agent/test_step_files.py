"""launch.json across agent versions: one attempt numbering (from 0), old files read back into it;
an attempt folder's removal; a whole file's read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.services.node_agent.process import step_files
from corral.services.node_agent.process.assignment import Assignment, RankAssignment
from corral.services.node_agent.process.step_files import STATE_VERSION, Launch


def assignment(attempt: int) -> Assignment:
    return Assignment(job_id="j", attempt=attempt, world_size=1, node_rank=0, master_addr="127.0.0.1",
                      master_port=29500, ranks=(RankAssignment(0, 0, (0,)),), command=("true",),
                      checkpoint_dir=Path("/c"), log_dir=Path("/l"))


def test_a_launch_round_trips_with_the_attempt_events_carry() -> None:
    launch = Launch(assignment(0), cause=None, kill_grace=5.0, launched_at=1.0)
    data = launch.to_json()
    assert data["version"] == STATE_VERSION == 2 and data["assignment"]["attempt"] == 0
    assert Launch.from_json(data).assignment.attempt == 0


def test_a_version_1_launch_counted_from_1_is_read_as_attempt_minus_1() -> None:
    """A stepd started by an agent of before (attempts from 1), adopted by this one after an upgrade."""
    data = Launch(assignment(1), cause=None, kill_grace=5.0, launched_at=1.0).to_json()
    data["version"] = 1
    assert Launch.from_json(data).assignment.attempt == 0


def _record(n: int) -> dict[str, object]:
    return {"phase": "running", "n": n}


def test_state_records_are_appended_to_the_claimed_file_and_the_last_complete_one_is_the_state(
        tmp_path: Path) -> None:
    from corral.services.node_agent.process import step_files

    path = tmp_path / step_files.STATE
    assert step_files.create_json(path, _record(0))
    inode = path.stat().st_ino
    step_files.append_state(path, _record(1))
    step_files.append_state(path, _record(2))
    assert path.stat().st_ino == inode  # no new inode per change
    assert step_files.read_state(tmp_path) == _record(2)
    with path.open("ab") as f:  # a record cut short (a crash mid-write) is not the state
        f.write(b'{"phase": "ended", "n"')
    assert step_files.read_state(tmp_path) == _record(2)
    step_files.append_state(path, _record(3))  # the next record is a line of its own all the same
    assert step_files.read_state(tmp_path) == _record(3)
    assert [step_files.last_record(line + b"\n") for line in path.read_bytes().splitlines()][-1] == _record(3)


def test_a_state_file_of_one_record_without_a_newline_is_read(tmp_path: Path) -> None:
    """As a stepd of an earlier version writes it (one JSON object, replaced whole)."""
    import json

    from corral.services.node_agent.process import step_files

    (tmp_path / step_files.STATE).write_text(json.dumps(_record(7)))
    assert step_files.read_state(tmp_path) == _record(7)


def test_a_long_state_file_is_replaced_by_its_newest_record(tmp_path: Path, monkeypatch: object) -> None:
    from corral.services.node_agent.process import step_files

    path = tmp_path / step_files.STATE
    for n in range(2000):
        step_files.append_state(path, _record(n))
    assert path.stat().st_size <= step_files.STATE_COMPACT_AT
    assert step_files.read_state(tmp_path) == _record(1999)


def test_an_attempt_is_marked_reported_by_its_folders_mode_and_a_reported_file_still_counts(tmp_path: Path) -> None:
    from corral.services.node_agent.process.step_files import REPORTED, is_reported, mark_reported

    folder, legacy = tmp_path / "attempt-0", tmp_path / "attempt-1"
    for f in (folder, legacy):
        f.mkdir()
        os.chmod(f, 0o711)
    assert not is_reported(folder) and not is_reported(legacy) and not is_reported(tmp_path / "gone")
    mark_reported(folder)
    assert is_reported(folder) and list(folder.iterdir()) == []  # no file made for it
    (legacy / REPORTED).touch()
    assert is_reported(legacy)
    os.chmod(folder, 0o700)  # closed to others by a umask alone is not the mark
    assert not is_reported(folder)


def test_a_claim_is_launch_json_s_inode_named_state_json_and_each_file_reads_as_before(tmp_path: Path) -> None:
    """The stepd's claim makes no inode: its first state goes after the launch line, and the name
    state.json is a hard link to it; launch.json is read from its first line, state.json from its
    last state line; an abandon after the claim (or a claim after the abandon) is refused."""
    from corral.services.node_agent.process import step_files

    launch = Launch(assignment(0), cause="ev", kill_grace=5.0, launched_at=1.0)
    step_files.write_new_json(tmp_path / step_files.LAUNCH, launch.to_json())
    assert step_files.claim_state(tmp_path, _record(0))
    assert (tmp_path / step_files.STATE).stat().st_ino == (tmp_path / step_files.LAUNCH).stat().st_ino
    assert step_files.read_launch(tmp_path) == launch
    assert step_files.read_state(tmp_path) == _record(0)
    step_files.append_state(tmp_path / step_files.STATE, _record(1))
    assert step_files.read_launch(tmp_path) == launch and step_files.read_state(tmp_path) == _record(1)
    assert not step_files.abandon(tmp_path, "j", 0, "late")
    assert not step_files.claim_state(tmp_path, _record(2))  # a second claim: refused
    assert step_files.read_launch(tmp_path) == launch
    for n in range(3, 2000):  # state.json replaced by its newest record: launch.json stays
        step_files.append_state(tmp_path / step_files.STATE, _record(n))
    assert step_files.read_state(tmp_path) == _record(1999)
    assert step_files.read_launch(tmp_path) == launch


def test_a_folder_abandoned_before_the_claim_is_not_claimed(tmp_path: Path) -> None:
    from corral.services.node_agent.process import step_files

    launch = Launch(assignment(0), cause=None, kill_grace=5.0, launched_at=1.0)
    step_files.write_new_json(tmp_path / step_files.LAUNCH, launch.to_json())
    assert step_files.abandon(tmp_path, "j", 0, "gone")
    assert not step_files.claim_state(tmp_path, _record(0))
    assert (step_files.read_state(tmp_path) or {})["phase"] == step_files.ABANDONED
    assert step_files.read_launch(tmp_path) == launch


def test_an_indented_launch_json_of_before_is_read(tmp_path: Path) -> None:
    import json

    from corral.services.node_agent.process import step_files

    launch = Launch(assignment(0), cause=None, kill_grace=5.0, launched_at=1.0)
    (tmp_path / step_files.LAUNCH).write_text(json.dumps(launch.to_json(), indent=2))
    assert step_files.read_launch(tmp_path) == launch
    (tmp_path / step_files.LAUNCH).write_text('{"assignment": ')  # cut short: not launched
    assert step_files.read_launch(tmp_path) is None


def test_an_attempt_folder_goes_whole_with_or_without_more_than_its_launch_and_state(tmp_path: Path) -> None:
    plain, more, missing = tmp_path / "j.attempt-0", tmp_path / "k.attempt-0", tmp_path / "gone.attempt-0"
    for folder in (plain, more):
        folder.mkdir()
        (folder / step_files.LAUNCH).write_text("{}\n")
        os.link(folder / step_files.LAUNCH, folder / step_files.STATE)
    (more / step_files.COMMANDS).write_text("[]\n")
    (more / "rank-0.control").write_text("")
    for folder in (plain, more, missing):
        step_files.remove_attempt(folder)
    assert list(tmp_path.iterdir()) == []


def test_a_whole_file_is_read_as_its_bytes(tmp_path: Path) -> None:
    big = bytes(range(256)) * 1000  # more than one read
    (tmp_path / "f").write_bytes(big)
    assert step_files.read_file(tmp_path / "f") == big
    assert step_files.read_file(str(tmp_path / "f")) == big
    with pytest.raises(FileNotFoundError):
        step_files.read_file(tmp_path / "missing")
