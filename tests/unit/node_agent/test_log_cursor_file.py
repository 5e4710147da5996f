"""A rank's log cursor file: a line appended per save (one inode per rank), the last complete one read."""

from __future__ import annotations

import json
from pathlib import Path

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
