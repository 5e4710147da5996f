"""Shipping a rank's output in bounded, rate-limited chunks (`node_agent.reporting.log_chunks`), pure."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.contracts.logs import TRUNCATED_MARK
from corral.services.node_agent.reporting.log_chunks import (
    LineSplitter,
    RankCursor,
    ShipLimits,
    TokenBucket,
    attempt_header,
    find_attempt_start,
)

ROOMY = ShipLimits(max_line_bytes=64, max_chunk_bytes=256, rate_bytes=10**9, burst_bytes=10**9)


def _feed_all(pieces: list[bytes], max_line: int = 64) -> list[tuple[str, bool, int, int]]:
    splitter = LineSplitter(0, max_line)
    lines = [line for piece in pieces for line in splitter.feed(piece)] + splitter.flush()
    return [(line.text, line.truncated, line.start, line.end) for line in lines]


def test_lines_carry_their_byte_positions_and_a_partial_line_waits_for_its_end() -> None:
    splitter = LineSplitter(100, 64)
    assert [(x.text, x.start, x.end) for x in splitter.feed(b"ab\ncd")] == [("ab", 100, 103)]
    assert [(x.text, x.start, x.end) for x in splitter.feed(b"e\n")] == [("cde", 103, 107)]
    assert splitter.feed(b"tail") == []
    assert [(x.text, x.start, x.end) for x in splitter.flush()] == [("tail", 107, 111)]


def test_a_long_line_is_cut_marked_and_the_rest_skipped_to_its_newline() -> None:
    lines = _feed_all([b"x" * 10, b"y" * 10, b"zz\nnext\n"], max_line=8)
    assert lines[0] == ("x" * 8 + TRUNCATED_MARK, True, 0, 10)  # ends where it was cut (what was read)
    assert lines[1] == ("next", False, 23, 28)
    assert len(lines) == 2


def test_invalid_utf8_is_replaced_not_refused() -> None:
    assert _feed_all([b"\xff\xfeok\n"])[0][0] == "\ufffd\ufffdok"


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300).map(lambda b: b.replace(b"\r", b"")), st.lists(st.integers(0, 300), max_size=6))
def test_how_the_bytes_arrive_never_changes_the_lines(data: bytes, cuts: list[int]) -> None:
    points = sorted({min(c, len(data)) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]

    def seen(lines: list[tuple[str, bool, int, int]]) -> list[tuple[str, bool, int, int | None]]:
        # a cut line ends where reading stood when it was cut (see the test above): that end is the
        # one thing the arrival may move; its text, flag and start, and every whole line, may not
        return [(text, cut, start, None if cut else end) for text, cut, start, end in lines]

    assert seen(_feed_all(pieces, max_line=16)) == seen(_feed_all([data], max_line=16))


def test_the_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    bucket = TokenBucket(rate=10, burst=20)
    assert bucket.take(20, 0.0) and not bucket.take(1, 0.0)
    assert bucket.take(10, 1.0) and not bucket.take(1, 1.0)
    assert bucket.take(20, 100.0) and not bucket.take(1, 100.0)  # never more than the burst
    assert not bucket.take(5, 99.0)  # a clock going back refills nothing


def _cursor(limits: ShipLimits = ROOMY, start: int = 0) -> RankCursor:
    return RankCursor("j1", 1, "node-0", 3, start, limits)


def test_chunks_are_bounded_contiguous_and_name_their_rank() -> None:
    cursor = _cursor()
    data = b"".join(f"line {i:03d}\n".encode() for i in range(100))
    read = cursor.next_read(len(data))
    assert (read.offset, read.length, read.skipped) == (0, len(data), 0)
    chunks = cursor.take(data, 0.0)
    assert len(chunks) > 1
    assert [line for c in chunks for line in c.lines] == [f"line {i:03d}" for i in range(100)]
    assert all(sum(len(x) + 1 for x in c.lines) <= 256 for c in chunks)
    assert chunks[0].offset == 0 and chunks[-1].end == len(data)
    assert all(a.end == b.offset for a, b in itertools.pairwise(chunks))
    assert {(c.job_id, c.attempt, c.node, c.rank) for c in chunks} == {("j1", 1, "node-0", 3)}
    assert cursor.shipped == len(data) and cursor.take(b"", 1.0) == []


def test_the_rate_limit_drops_lines_and_says_how_many() -> None:
    limits = ShipLimits(max_line_bytes=64, max_chunk_bytes=256, rate_bytes=20, burst_bytes=40)
    cursor = _cursor(limits)
    data = b"".join(b"%09d\n" % i for i in range(10))  # 10 bytes each: 4 fit in the burst
    chunks = cursor.take(data, 0.0)
    assert [line for c in chunks for line in c.lines] == [f"{i:09d}" for i in range(4)]
    assert sum(c.dropped for c in chunks) == 6 and chunks[-1].end == len(data)
    later = cursor.take(b"after\n", 1.0)  # a second refills 20 bytes
    assert later[0].lines == ["after"] and later[0].dropped == 0 and later[0].offset == len(data)


def test_dropped_lines_alone_are_reported_at_most_once_a_second() -> None:
    limits = ShipLimits(max_line_bytes=64, max_chunk_bytes=256, rate_bytes=1, burst_bytes=10)
    cursor = _cursor(limits)
    assert cursor.take(b"123456789\n", 0.0)[0].lines == ["123456789"]
    assert cursor.take(b"dropped\n", 0.1) == []  # withheld: a note a poll would flood the stream
    notice = cursor.take(b"dropped\n", 1.5)
    assert notice[0].lines == [] and notice[0].dropped == 2 and notice[0].end == 26


def test_a_backlog_beyond_the_limit_is_skipped_to_the_newest_output() -> None:
    limits = ShipLimits(max_line_bytes=64, max_chunk_bytes=256, rate_bytes=10**9, burst_bytes=10**9,
                        max_read_bytes=100, max_backlog_bytes=1000)
    cursor = _cursor(limits)
    read = cursor.next_read(5000)
    assert (read.offset, read.length, read.skipped) == (4900, 100, 4900)
    chunks = cursor.take(b"rest of a line\nnew\n", 0.0)  # the first partial line is not shown
    assert chunks[0].lines == ["new"] and chunks[0].skipped_bytes == 4900 and chunks[0].offset == 0


def test_the_attempt_ends_at_the_next_attempts_header_and_the_last_chunk_is_final() -> None:
    cursor = _cursor()
    data = b"mine\n" + attempt_header("j1", 2, 3) + b"node_rank 0 ====\nnot mine\n"
    chunks = cursor.take(data, 0.0)
    assert [line for c in chunks for line in c.lines] == ["mine"] and chunks[-1].final and cursor.ended
    assert cursor.take(b"more\n", 1.0) == []


def test_the_rank_exit_flushes_its_partial_line_as_final() -> None:
    cursor = _cursor()
    assert cursor.take(b"a\nno newline", 0.0)[0].lines == ["a"]
    last = cursor.take(b"", 1.0, final=True)
    assert last[-1].lines == ["no newline"] and last[-1].final


def test_a_truncated_file_is_read_again_from_its_start() -> None:
    cursor = _cursor(start=500)
    read = cursor.next_read(10)
    assert (read.offset, read.length) == (0, 10) and cursor.shipped == 0


def test_the_attempt_header_is_found_only_at_a_line_start() -> None:
    header = attempt_header("j1", 1, 3)
    tail = b"old\n" + header + b"x ====\nout\necho " + header + b"\n"
    assert find_attempt_start(tail, 1000, "j1", 1, 3) == 1004
    assert find_attempt_start(header + b"\n", 0, "j1", 1, 3) == 0
    assert find_attempt_start(header + b"\n", 7, "j1", 1, 3) is None  # mid-line: the byte before is unknown
    assert find_attempt_start(b"nothing\n", 0, "j1", 1, 3) is None


def test_limits_come_from_the_environment_and_are_checked() -> None:
    assert ShipLimits.from_env({"CORRAL_LOG_RATE_BYTES": "1000"}).rate_bytes == 1000
    import pytest

    with pytest.raises(ValueError, match="CORRAL_LOG_RATE_BYTES"):
        ShipLimits.from_env({"CORRAL_LOG_RATE_BYTES": "fast"})
    with pytest.raises(ValueError, match="must not exceed"):
        ShipLimits(max_line_bytes=100, max_chunk_bytes=10)
