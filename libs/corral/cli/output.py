"""Printing for people and for scripts: rich tables by default, exact JSON with `--json`.

Why: every listing is read by people at a terminal and by scripts; both forms come from the same
rows, so they can never disagree.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

console = Console()
err_console = Console(stderr=True)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    table = Table(title=title, show_edge=False, header_style="bold")
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*["" if v is None else str(v) for v in row])
    console.print(table)


def rows_as_dicts(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[Mapping[str, Any]]:
    return [dict(zip((c.lower() for c in columns), row, strict=True)) for row in rows]


def fail(message: str, code: int = 1) -> None:
    """One clear line on stderr and a non-zero exit; never a traceback for expected failures."""
    err_console.print(f"[red]error:[/red] {message}", highlight=False)
    raise SystemExit(code)
