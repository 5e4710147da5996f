"""A rank's output goes through the stepd to its log; a full log folder drops it, never the rank."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.services.node_agent.process.rank_output import RankOutput


class Disk:
    """A log file on a disk that can be made full."""

    def __init__(self, path: Path) -> None:
        self.path, self.full = path, False

    def open(self) -> int:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)


def test_output_the_disk_refuses_is_counted_and_a_marker_says_so_once_it_takes_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disk = Disk(tmp_path / "rank-0.log")
    out = RankOutput(disk.open)
    out.open()
    out.write(b"before\n")
    real_write = os.write

    def full_write(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full_write)
    out.write(b"lost 1\n")
    out.write(b"lost 22\n")
    assert out.dropped == 15
    monkeypatch.setattr(os, "write", real_write)
    out.write(b"after\n")
    out.close()
    assert disk.path.read_bytes() == (b"before\n==== corral: 15 bytes of output dropped: the log folder refused "
                                      b"them (No space left on device) ====\nafter\n")


def test_a_log_that_cannot_be_created_on_a_full_disk_is_opened_later(tmp_path: Path) -> None:
    disk = Disk(tmp_path / "rank-0.log")
    disk.full = True
    out = RankOutput(disk.open)
    out.open()  # no error: the rank runs, its output waits for the disk
    out.write(b"x" * 10)
    disk.full = False
    out.write(b"y\n")
    out.close()
    assert disk.path.read_bytes().endswith(b"10 bytes of output dropped: the log folder refused them "
                                           b"(No space left on device) ====\ny\n")


def test_a_log_that_cannot_be_opened_for_another_reason_fails_the_start(tmp_path: Path) -> None:
    (tmp_path / "rank-0.log").mkdir()
    out = RankOutput(Disk(tmp_path / "rank-0.log").open)
    with pytest.raises(IsADirectoryError):
        out.open()


@settings(deadline=None)  # a folder and a file per example: on a loaded machine a deadline times the disk
@given(st.lists(st.binary(min_size=1, max_size=300), max_size=20))
def test_what_comes_through_the_pipe_is_the_log_in_order(chunks: list[bytes]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "log"
        out = RankOutput(Disk(path).open)
        out.open()
        r, w = os.pipe()
        out.attach(r)
        for chunk in chunks:
            os.write(w, chunk)
            assert out.pump()
        os.close(w)
        assert out.pump() is False and out.pipe is None
        out.close()
        assert path.read_bytes() == b"".join(chunks)
