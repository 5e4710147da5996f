"""Tables a person reads at 80 columns: ids whole, nodes in natural order, ages at the asked moment."""

from __future__ import annotations

import io
import string
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from corral.cli import output
from corral.cli.present import JOB_COLUMNS, age, natural_key


def render(width: int, columns: list[str], rows: list[list[str]], below: str | None = None) -> str:
    buffer = io.StringIO()
    saved = output.console
    output.console = Console(file=buffer, width=width, color_system=None)
    try:
        output.print_table(None, columns, rows, below=below)
    finally:
        output.console = saved
    return buffer.getvalue()


def test_jobs_at_80_columns_keep_every_id_whole() -> None:
    ids = [f"j01m8vay{n:07d}" for n in range(5)]
    rows = [[i, "low-priority-train-with-a-long-name", "team-a/sub-team", "100", "CANCELLED", "16",
             "node-0,node-1,node-2,node-3", "25s", "MAX_GPUS_EXCEEDED: queue team-a uses 16 of max 32 GPUs"]
            for i in ids]
    for width in (80, 60):
        text = render(width, JOB_COLUMNS, rows)
        assert all(len(line.rstrip()) <= width for line in text.splitlines()), text
        for job_id in ids:
            assert f"{job_id} " in text, text
        assert "…" not in text
        narrow = render(width, JOB_COLUMNS, rows, below="REASON")  # as `corral jobs` prints it
        assert all(len(line.rstrip()) <= width for line in narrow.splitlines()), narrow
        assert all(f"{job_id}: MAX_GPUS_EXCEEDED" in narrow for job_id in ids), narrow
    wide = render(200, JOB_COLUMNS, rows, below="REASON")
    assert "REASON" in wide and ": MAX_GPUS" not in wide.replace("16 of", "")


def test_nodes_sort_naturally_and_ages_count_from_the_given_moment() -> None:
    assert sorted(["node-10", "node-2", "node-1", "rack-b", "node-1a"], key=natural_key) == [
        "node-1", "node-1a", "node-2", "node-10", "rack-b"]
    then = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert age(then - timedelta(seconds=30), then) == "30s"


_CELL = st.text(alphabet=string.ascii_letters + string.digits + " -:,/[]é", max_size=14)


@settings(max_examples=100, deadline=None)
@given(title=st.one_of(st.none(), st.text(alphabet=string.ascii_letters + " :", min_size=1, max_size=30)),
       columns=st.lists(st.text(alphabet=string.ascii_uppercase, min_size=1, max_size=8), min_size=1, max_size=6),
       data=st.data(), width=st.integers(10, 120))
def test_a_table_that_fits_prints_as_rich_prints_it(title: str | None, columns: list[str], data: st.DataObject,
                                                    width: int) -> None:
    """Big tables skip rich's renderer (~1 ms a row) when they fit as they are: the text is the same."""
    rows = data.draw(st.lists(st.lists(_CELL, min_size=len(columns), max_size=len(columns)), max_size=5))

    def printed(plain: bool) -> str:
        buffer, saved, fast = io.StringIO(), output.console, output._print_plain
        output.console = Console(file=buffer, width=width, color_system=None)
        if not plain:
            output._print_plain = lambda *_: False
        try:
            output.print_table(title, columns, rows)
        finally:
            output.console, output._print_plain = saved, fast
        return buffer.getvalue()

    assert printed(plain=True) == printed(plain=False)
