"""A rank's log cursor file: a line appended per save (one inode per rank), the last complete one read."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.services.node_agent.reporting.log_shipper import _Saved


def test_saves_append_to_one_file_and_the_last_complete_line_is_the_cursor(tmp_path: Path) -> None:
    saved = _Saved(tmp_path / "attempt-0" / "rank-0.json")
    saved.save(0, 10, False)  # its folder is made on first use
    inode = saved.path.stat().st_ino
    saved.save(0, 25, True)
    assert saved.path.stat().st_ino == inode and saved.path.stat().st_mode & 0o777 == 0o600
    assert saved.load() == {"start": 0, "shipped": 25, "done": True}
    with saved.path.open("ab") as f:  # an agent killed mid-write
        f.write(b'{"done": false, "shipped": 9')
    assert saved.load() == {"start": 0, "shipped": 25, "done": True}


def test_a_cursor_written_whole_is_read_and_saved_on(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.json"
    path.write_text(json.dumps({"start": 5, "shipped": 7, "done": False}))  # one record, no newline
    saved = _Saved(path)
    assert saved.load() == {"start": 5, "shipped": 7, "done": False}
    saved.save(5, 9, False)
    assert saved.load() == {"start": 5, "shipped": 9, "done": False}


def test_cursors_are_lines_of_the_attempts_launch_json_and_the_stepds_files_read_as_before(tmp_path: Path) -> None:
    """Each rank's saves are lines appended to launch.json (no file per rank): the launch is still
    its first line, the state (the same inode once claimed) its last state line; a folder without
    launch.json keeps the rank's own file; a rank's own file of before is read when launch.json
    has none of the rank's."""
    from corral.services.node_agent.process import step_files
    from corral.services.node_agent.process.assignment import Assignment, RankAssignment

    folder = tmp_path / "j" / "attempt-0"
    folder.mkdir(parents=True)
    a = Assignment(job_id="j", attempt=0, world_size=2, node_rank=0, master_addr="127.0.0.1", master_port=29500,
                   ranks=(RankAssignment(0, 0, (0,)), RankAssignment(1, 1, (1,))), command=("true",),
                   checkpoint_dir=tmp_path / "c", log_dir=tmp_path / "l")
    launch = step_files.Launch(a, cause=None, kill_grace=5.0, launched_at=1.0)
    step_files.write_new_json(folder / step_files.LAUNCH, launch.to_json())
    assert step_files.claim_state(folder, {"phase": "running", "n": 1})
    ranks = [_Saved(folder / f"rank-{r}.json", shared=folder / step_files.LAUNCH, rank=r) for r in (0, 1)]
    (folder / "rank-1.json").write_text(json.dumps({"start": 3, "shipped": 4, "done": False}))  # of before
    assert ranks[1].load() == {"start": 3, "shipped": 4, "done": False}
    ranks[0].save(0, 10, False)
    ranks[1].save(3, 20, False)
    ranks[0].save(0, 30, True)
    assert not (folder / "rank-0.json").exists()
    assert ranks[0].load() == {"start": 0, "shipped": 30, "done": True}
    assert ranks[1].load() == {"start": 3, "shipped": 20, "done": False}
    assert step_files.read_launch(folder) == launch
    assert step_files.read_state(folder) == {"phase": "running", "n": 1}
    alone = _Saved(tmp_path / "k" / "attempt-0" / "rank-0.json", shared=tmp_path / "k" / "attempt-0" / "launch.json",
                   rank=0)
    alone.save(0, 5, True)  # no launch.json: the rank's own file, as before
    assert alone.load() == {"start": 0, "shipped": 5, "done": True} and alone.path.exists()
    assert not (tmp_path / "k" / "attempt-0" / "launch.json").exists()
    step_files.remove_attempt(folder)  # reported and over while its rank's last output still ships
    ranks[1].save(3, 40, True)
    assert not folder.exists()  # not made again: nothing will resume from it


_VALUES = st.one_of(st.text(max_size=12), st.integers(), st.booleans(), st.none())
_RECORDS = st.one_of(
    st.dictionaries(st.sampled_from(["phase", "env", "shipped", "start", "x"]), _VALUES, max_size=4),
    st.builds(lambda s, n, d, r: {"start": s, "shipped": n, "done": d, "cursor_rank": r},
              st.integers(0, 99), st.integers(0, 99), st.booleans(), st.integers(0, 2)))


@settings(max_examples=100, deadline=None)
@given(records=st.lists(_RECORDS, max_size=6), rank=st.integers(0, 2))
def test_a_launch_json_without_the_cursor_key_is_skipped_as_the_plain_reading_would(records: list[dict[str, object]],
                                                                                  rank: int) -> None:
    """The shortcut (a file without `"shipped"` holds no cursor) against reading every line."""
    import tempfile

    from corral.services.node_agent.process.step_files import last_record

    with tempfile.TemporaryDirectory() as tmp:
        shared = Path(tmp) / "launch.json"
        data = b"".join(json.dumps(r, sort_keys=True).encode() + b"\n" for r in records)
        shared.write_bytes(data)
        saved = _Saved(Path(tmp) / "rank.json", shared=shared, rank=rank)
        plain = last_record(data, saved._mine)
        expected = None if plain is None else {"start": int(plain["start"]), "shipped": int(plain["shipped"]),
                                               "done": bool(plain.get("done"))}
        assert saved.load() == expected
