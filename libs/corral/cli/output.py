"""Printing for people and for scripts: rich tables by default, exact JSON with `--json`.

Why: every listing is read by people at a terminal and by scripts; both forms come from the same
rows, so they can never disagree.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from corral.cli import plain

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text


class _Console:
    """rich's console, made on first use: a line of the hot commands' markup printed to a pipe is
    written as rich writes it without importing rich (`corral.cli.plain`); anything else is rich's."""

    def __init__(self, *, stderr: bool = False) -> None:
        self._stderr = stderr
        self._rich: Console | None = None

    @property
    def rich(self) -> Console:
        if self._rich is None:
            from rich.console import Console

            self._rich = Console(stderr=self._stderr)
        return self._rich

    def __getattr__(self, name: str) -> Any:
        return getattr(self.rich, name)

    @property
    def width(self) -> int:
        if self._rich is None and plain.stream(self._stderr) is not None:
            columns = plain.width()
            if columns is not None:
                return columns
        return self.rich.width

    def plain(self, lines: Sequence[str]) -> bool:
        """Write `lines` of markup as rich would to a stream that is not a terminal (True), or
        nothing (False: rich prints them)."""
        out, columns = plain.stream(self._stderr), plain.width()
        if self._rich is not None or out is None or columns is None:
            return False
        texts = [plain.render(line, columns) for line in lines]
        if any(t is None for t in texts):
            return False
        out.write("".join(texts))  # type: ignore[arg-type]
        out.flush()
        return True

    def print(self, *objects: Any, **options: Any) -> None:
        if len(objects) == 1 and isinstance(objects[0], str) and set(options) <= {"highlight"} \
                and self.plain([objects[0]]):
            return
        self.rich.print(*objects, **options)


console: Any = _Console()
err_console: Any = _Console(stderr=True)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


# Columns whose values people copy into the next command: never wrapped, never cut with "…".
WHOLE_COLUMNS = frozenset({"ID", "JOB"})
SHORT = 10  # a column whose every value is at most this wide is kept on one line while room allows
MIN_LONG = 7  # ... if each wrapping column still gets this many characters


def make_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[str]],
               whole: frozenset[str] = WHOLE_COLUMNS, width: int | None = None) -> Table:
    """A table that fits the terminal (80 columns too) without cutting an id.

    rich shrinks a too-wide table by wrapping the wrappable columns first and only as a last resort
    cuts every column with "…" — which turned every job id into the same `j01m8x…` at 80 columns.
    Here id columns are never wrappable, short columns (states, numbers, ages) stay on one line
    while that leaves room, and long text (names, node lists, reasons) wraps, breaking long words:
    the long text always gives way first and an id stays whole.
    """
    from rich import box
    from rich.table import Table

    width = width or console.width
    table = Table(title=title, show_edge=False, header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0))
    widest = [max([len(col), *(len(r[i]) for r in rows)]) for i, col in enumerate(columns)]
    short = [col not in whole and w <= SHORT for col, w in zip(columns, widest, strict=True)]
    kept = sum(w + 2 for col, w, s in zip(columns, widest, short, strict=True) if s or col in whole)
    long_columns = sum(1 for s, col in zip(short, columns, strict=True) if not s and col not in whole)
    keep_short = kept + MIN_LONG * long_columns <= width
    for col, is_short in zip(columns, short, strict=True):
        if col in whole or (is_short and keep_short):
            table.add_column(col, no_wrap=True, overflow="ignore")
        else:
            table.add_column(col, overflow="fold")
    return table


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                whole: frozenset[str] = WHOLE_COLUMNS, below: str | None = None) -> None:
    """Print rows as a table; `below` names a long-text column (REASON) that, when the table is too
    wide for the terminal, is printed under the table as `ID: text` lines instead of squeezed into
    a column a few characters wide."""
    cells = [["" if v is None else str(v) for v in row] for row in rows]
    notes: list[tuple[str, str]] = []
    if below is not None and below in columns and _natural_width(columns, cells) > console.width:
        at = list(columns).index(below)
        notes = [(row[0], row[at]) for row in cells if row[at]]
        columns = [c for i, c in enumerate(columns) if i != at]
        cells = [[v for i, v in enumerate(row) if i != at] for row in cells]
    if not _print_plain(title, columns, cells):
        table = make_table(title, columns, cells, whole)
        for row in cells:
            table.add_row(*row)
        console.print(table)
    if notes and not (isinstance(console, _Console) and console.plain([f"{key}: {text}" for key, text in notes])):
        from rich.text import Text

        # one print: rich's per-call cost (~0.5 ms) was most of `corral jobs` with 1,000 jobs
        console.print(Text("\n").join(Text.from_markup(f"{key}: {text}") for key, text in notes), highlight=False)


_EMOJI_CODE = re.compile(r":\S*?:")  # rich turns `:x:` in a cell into an emoji


def _print_plain(title: str | None, columns: Sequence[str], cells: Sequence[Sequence[str]]) -> bool:
    """Print what rich would print for a table that fits the terminal as it is, in a fraction of
    the time (rich renders ~1 ms per row: 1,000 pending jobs took `corral jobs` a second); False,
    printing nothing, for any table this cannot render exactly as rich does (one that must wrap,
    a title wider than it, text rich reads as markup or emoji codes, or measures differently)."""
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    total = sum(widths) + 2 * len(widths) - 1
    if total > console.width or (title is not None and (len(title) > total or title != title.strip())):
        return False  # rich wraps, or trims a title's edge spaces its own way
    if not all(v.isascii() and v.isprintable() and "[" not in v and not _EMOJI_CODE.search(v)
               for r in cells for v in r):
        return False
    if isinstance(console, _Console) and console._rich is None:
        out = plain.stream(stderr=False)
        if out is not None:  # rich would print it unstyled: the same characters, without rich
            head = [] if title is None else [_centered(title, total)]
            out.write("\n".join([*head, " ".join(c.ljust(w + 1) for c, w in zip(columns, widths, strict=True)),
                                 "─" * total, *(" ".join(v.ljust(w + 1) for v, w in zip(r, widths, strict=True))
                                                for r in cells)]) + "\n")
            out.flush()
            return True
    text = plain_table(title, columns, cells, console.width)
    if text is None:
        return False
    console.print(text, soft_wrap=True, highlight=False, markup=False, emoji=False)
    return True


def plain_table(title: str | None, columns: Sequence[str], cells: Sequence[Sequence[str]], width: int, *,
                title_left: bool = False) -> Text | None:
    """The table rich draws for these cells (`make_table`'s box and padding) as one `Text`, or None
    for any table this cannot draw exactly as rich does (one wider than `width`, which rich wraps;
    a title wider than it; text rich reads as markup or emoji codes, or measures differently).
    `title_left`: the title bold on the left (`corral top`'s tables), not centred in italics."""
    from rich.text import Text

    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    total = sum(widths) + 2 * len(widths) - 1
    if total > width or (title is not None and (len(title) > total or title != title.strip())):
        return None  # rich wraps, or trims a title's edge spaces its own way
    if not all(v.isascii() and v.isprintable() and "[" not in v and not _EMOJI_CODE.search(v)
               for r in cells for v in r):
        return None
    text = Text()
    if title is not None:
        if title_left:
            text.append(title.ljust(total), style="bold")
        else:
            text.append(_centered(title, total), style="italic")
        text.append("\n")
    last = len(columns) - 1
    for i, (col, w) in enumerate(zip(columns, widths, strict=True)):
        text.append(col.ljust(w + 1), style="bold")
        if i < last:
            text.append(" ")
    text.append("\n" + "─" * total + ("\n" if cells else ""))
    text.append("\n".join(" ".join(v.ljust(w + 1) for v, w in zip(r, widths, strict=True)) for r in cells))
    return text


def _centered(title: str, width: int) -> str:
    left = (width - len(title)) // 2
    return " " * left + title + " " * (width - len(title) - left)


def _natural_width(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> int:
    return sum(max([len(c), *(len(r[i]) for r in rows)]) + 2 for i, c in enumerate(columns))


def rows_as_dicts(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[Mapping[str, Any]]:
    return [dict(zip((c.lower() for c in columns), row, strict=True)) for row in rows]


def fail(message: str, code: int = 1) -> None:
    """One clear line on stderr and a non-zero exit; never a traceback for expected failures."""
    err_console.print(f"[red]error:[/red] {message}", highlight=False)
    raise SystemExit(code)
