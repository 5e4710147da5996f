"""How `corral logs` prints chunks read from the bus (`corral.cli.logs`): what was left out is said."""

from __future__ import annotations

from corral.cli.commands.logs import group
from corral.cli.logs import Printer, chunk_text
from corral.contracts.logs import LogChunk


def _chunk(attempt: int, rank: int, offset: int, lines: list[str], **kw: object) -> LogChunk:
    return LogChunk(job_id="j", attempt=attempt, node="node-0", rank=rank, offset=offset, end=offset + 10,
                    lines=lines, **kw)


def test_drops_and_skips_are_said_where_they_happened() -> None:
    text = chunk_text(_chunk(0, 0, 0, ["after"], dropped=3, skipped_bytes=500))
    assert text.splitlines() == [
        "[corral: 500 bytes skipped: the rank wrote faster than its node ships; the whole file is on node-0]",
        "[corral: 3 line(s) dropped by the rate limit; the whole file is on node-0]", "after"]


def test_json_groups_each_attempt_and_rank_in_file_order() -> None:
    chunks = [_chunk(1, 0, 0, ["b0"]), _chunk(0, 1, 10, ["a1 second"]), _chunk(0, 1, 0, ["a1 first"], truncated=1),
              _chunk(0, 0, 0, ["a0"], final=True)]
    entries = group(chunks)
    assert [(e["attempt"], e["rank"], e["lines"]) for e in entries] == [
        (0, 0, ["a0"]), (0, 1, ["a1 first", "a1 second"]), (1, 0, ["b0"])]
    assert entries[0]["complete"] and not entries[1]["complete"] and entries[1]["truncated"] == 1


def test_a_title_whenever_the_source_changes() -> None:
    out: list[str] = []
    printer = Printer(out.append, lambda title: out.append(f"-- {title}"))
    for c in (_chunk(0, 0, 0, ["x"]), _chunk(0, 0, 10, ["y"]), _chunk(0, 1, 0, ["z"])):
        printer(c)
    assert out == ["-- attempt 0 · rank 0 · node-0", "x\n", "y\n", "-- attempt 0 · rank 1 · node-0", "z\n"]
