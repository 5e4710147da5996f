"""`corral --help` and every subcommand's help read cleanly at 80 and 120 columns: docstrings and
option help reflow to the terminal (no line broken mid-sentence where the next word would have
fit), and nothing runs past the width."""

from __future__ import annotations

import re
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from corral.cli.main import app
from corral.services.node_agent.__main__ import parser as agent_parser

#: A line that ends a phrase: what may legitimately stop short of the width.
_ENDS = re.compile(r"[.,;:!?)\]}>'\"`*]$")


def _commands(command: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
    yield path, command
    for name, sub in sorted(getattr(command, "commands", {}).items()):  # a group (typer's own click)
        if not sub.hidden:
            yield from _commands(sub, [*path, name])


COMMANDS = list(_commands(typer.main.get_command(app), []))


def _broken(lines: list[str], width: int) -> list[str]:
    """Lines outside the option panels that stop although the next line's first word would fit
    and the next line goes on with the same sentence (it starts lowercase)."""
    found = []
    for line, following in pairwise(lines):
        if "│" in line or "│" in following or not line.strip() or not following.strip():
            continue
        word = following.split()[0]
        if word[0].islower() and not _ENDS.search(line.rstrip()) and len(line.rstrip()) + 1 + len(word) <= width - 2:
            found.append(f"{line.rstrip()!r} / {following.strip()!r}")
    return found


def _help(path: list[str], width: int, monkeypatch: pytest.MonkeyPatch) -> str:
    if path == ["agent"]:  # `corral agent` execs the node agent, whose own parser holds its help
        monkeypatch.setenv("COLUMNS", str(width))
        return agent_parser().format_help()
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, (path, result.output)
    return result.output


@pytest.mark.parametrize("width", [80, 120])
def test_every_help_reflows_at_the_terminal_width(width: int, monkeypatch: pytest.MonkeyPatch) -> None:
    assert len(COMMANDS) > 30  # every command is registered (`corral.cli.main.app`)
    problems = []
    for path, _ in COMMANDS:
        lines = _help(path, width, monkeypatch).split("\n")
        problems += [f"corral {' '.join(path)}: {len(line)} columns: {line!r}" for line in lines if len(line) > width]
        problems += [f"corral {' '.join(path)}: broken: {b}" for b in _broken(lines, width)]
    assert not problems, "\n".join(problems)


def test_no_option_help_carries_a_hand_made_line_break() -> None:
    """Option help is one string that rich wraps in its column; a newline in it would stay."""
    found = [f"corral {' '.join(path)} {param.name}" for path, command in COMMANDS for param in command.params
             if "\n" in (getattr(param, "help", None) or "")]
    assert not found, found
