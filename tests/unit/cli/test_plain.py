"""The hot commands' lines printed without rich read exactly as rich prints them to a pipe."""

from __future__ import annotations

import io

from hypothesis import example, given, settings
from hypothesis import strategies as st
from rich.console import Console

from corral.cli import plain

_PIECES = st.sampled_from(["a", "job", "j01m97mydfvsqsb-00009", " ", "  ", "[bold]", "[/bold]", "[red]", "[/red]",
                           "[yellow]", "[/yellow]", ":", "07:02:01", ":smile:", ":100:", "x" * 30, "\n", "-", ",",
                           "(", ")", "`", "[", "]", "é", "\t"])


def by_rich(markup: str, width: int) -> str:
    buffer = io.StringIO()
    Console(file=buffer, width=width, color_system=None).print(markup, highlight=False)
    return buffer.getvalue()


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(_PIECES, max_size=40), width=st.integers(5, 130))
@example(pieces=["[red]", "error:", "[/red]", " ", "cannot reach the cluster at postgresql://u@127.0.0.1:5/db"],
         width=40)
@example(pieces=["[bold]", "submitted_at", "[/bold]", "  ", "2026-12-07T07:02:01.228670+00:00"], width=120)
def test_plain_prints_what_rich_prints_or_leaves_it_to_rich(pieces: list[str], width: int) -> None:
    markup = "".join(pieces)
    text = plain.render(markup, width)
    if text is not None:
        assert text == by_rich(markup, width)


def test_the_lines_of_the_hot_commands_are_printed_without_rich() -> None:
    for markup in ("Submitted job [bold]j01[/bold]: admitted to queue bench (priority 500)",
                   "[bold]" + "submitted_at".rjust(13) + "[/bold]  2026-12-07T07:02:01.228670+00:00",
                   "... and 906 more (1,006 match; the oldest 100 are shown): `--limit N` shows N, `--limit 0` "
                   "every one; narrow with --queue, --user or --state"):
        assert plain.render(markup, 80) == by_rich(markup, 80)
    assert plain.render("I :smile: here", 80) is None  # rich's emoji: left to rich
    assert plain.render("[link=x]y[/link]", 80) is None


def test_the_emoji_names_rich_knows_are_made_of_the_alphabet_read_here() -> None:
    from rich._emoji_codes import EMOJI

    ascii_names = [name for name in EMOJI if name.isascii()]
    assert not {c for name in ascii_names for c in name} - plain.EMOJI_ALPHABET
    assert {name for name in ascii_names if name.isdigit()} == plain.DIGIT_EMOJI


def test_a_console_writing_to_a_terminal_is_left_to_rich(monkeypatch: object) -> None:
    import pytest

    mp = pytest.MonkeyPatch()
    try:
        mp.delenv("FORCE_COLOR", raising=False)
        mp.delenv("TTY_COMPATIBLE", raising=False)
        mp.setattr("sys.stdout", io.StringIO())
        assert plain.stream(stderr=False) is not None
        mp.setenv("FORCE_COLOR", "1")
        assert plain.stream(stderr=False) is None
        mp.setenv("TTY_COMPATIBLE", "0")
        assert plain.stream(stderr=False) is not None
        mp.setenv("COLUMNS", "97")
        assert plain.width() == 97
    finally:
        mp.undo()


def test_tables_and_lines_printed_to_a_pipe_without_rich_read_as_rich_prints_them() -> None:
    import pytest

    from corral.cli import output

    rows = [["j01m97mydfvsqsb-00009", "cli-bench", "bench", "500", "PENDING", "8", "", "3m",
             "GANG_DOES_NOT_FIT: needs 1x8 GPUs; 0 matching GPUs are free in the cluster; queue bench uses 32 of 32"]]
    columns = ["ID", "NAME", "QUEUE", "PRIO", "STATE", "GPUS", "NODES", "AGE", "REASON"]

    def printed(console: object) -> str:
        mp = pytest.MonkeyPatch()
        buffer = io.StringIO()
        try:
            for name in ("FORCE_COLOR", "TTY_COMPATIBLE"):
                mp.delenv(name, raising=False)
            mp.setenv("COLUMNS", "90")
            mp.setattr("sys.stdout", buffer)
            mp.setattr(output, "console", console)
            output.print_table("jobs", columns, rows, below="REASON")
            output.print_table(None, columns[:3], [r[:3] for r in rows])
            output.console.print("[bold]id[/bold]  j1", highlight=False)
        finally:
            mp.undo()
        return buffer.getvalue()

    light = output._Console()
    assert printed(light) == printed(Console(width=90, color_system=None, file=None))
    assert light._rich is None, "rich was not needed"
