"""What rich prints for a line of console markup when its output is not a terminal, without rich.

Why: importing rich's console cost a `corral jobs|show|submit|cancel` call ~15% of its CPU, and
what those commands print to a pipe (a script, `bench/cli.py`, `| less`) is plain text: rich drops
every style when its stream is not a terminal, and only strips the markup tags and wraps the words
at the console's width. This does the same for the text those commands print (ASCII, the tags
`[bold]`, `[red]`, `[yellow]` and their closings), and answers None for anything else (another
tag, an emoji code rich would replace, a terminal that rich would style): the caller then prints
with rich. tests/unit/cli/test_plain.py compares both on generated text.
"""

from __future__ import annotations

import builtins
import os
import re
import sys
from typing import TextIO

from corral import environment

#: The markup the hot commands print; any other tag is rich's to read.
_TAGS = re.compile(r"\[(?:/?(?:bold|red|yellow))\]")
_EMOJI = re.compile(r"(:(\S*?)(?:(?:\-)(emoji|text))?:)")  # rich._emoji_replace's
_WORD = re.compile(r"\s*\S+\s*")  # rich._wrap's


def stream(stderr: bool) -> TextIO | None:
    """The stream a rich console for stdout (stderr) writes to, when rich would print it unstyled
    (`rich.console.Console.is_terminal` False); None when rich would style it."""
    out = sys.stderr if stderr else sys.stdout
    if "get_ipython" in vars(builtins) or getattr(sys.stdin, "__module__", "").startswith("idlelib"):
        return None
    env = environment.mapping()
    tty_compatible = env.get("TTY_COMPATIBLE", "")
    if tty_compatible == "1" or (tty_compatible != "0" and env.get("FORCE_COLOR", "") != ""):
        return None
    if tty_compatible != "0" and "FORCE_COLOR" not in env:
        try:
            if out.isatty():
                return None
        except (ValueError, AttributeError):
            pass
    return out


def width() -> int | None:
    """The width rich gives a console that is not a terminal (`Console.size`): $COLUMNS, else the
    size of the first of stdin, stdout and stderr that is a terminal, else 80; None for a
    $COLUMNS of 0 (rich's own arithmetic)."""
    columns = environment.get("COLUMNS")
    if columns is not None and columns.isdigit():
        return int(columns) or None
    for fd in (0, 1, 2):
        try:
            return os.get_terminal_size(fd).columns or 80
        except (AttributeError, ValueError, OSError):
            continue
    return 80


def render(markup: str, columns: int) -> str | None:
    """What `Console(width=columns).print(markup)` writes to a stream that is not a terminal, or
    None when this cannot say it exactly."""
    if not markup.isascii() or "\\" in markup or not all(line.isprintable() for line in markup.split("\n")):
        return None
    segments = _TAGS.split(markup)
    if any("[" in s or _emoji_in(s) for s in segments) or not _balanced(_TAGS.findall(markup)):
        return None
    return "\n".join(line for text in "".join(segments).split("\n") for line in _wrap(text, columns)) + "\n"


def _balanced(tags: list[str]) -> bool:
    """Whether every closing tag closes one opened before it (rich raises MarkupError otherwise)."""
    opened: list[str] = []
    for tag in tags:
        if not tag.startswith("[/"):
            opened.append(tag[1:-1])
        elif tag[2:-1] in opened:
            del opened[len(opened) - 1 - opened[::-1].index(tag[2:-1])]
        else:
            return False
    return True


#: What rich's emoji names are made of (ASCII), and those made of digits alone (`rich._emoji_codes`).
EMOJI_ALPHABET = frozenset("!#&()*+-.0123456789_abcdefghijklmnopqrstuvwxyz")
DIGIT_EMOJI = frozenset({"100", "1234"})


def _emoji_in(text: str) -> bool:
    """Whether rich replaces an emoji code in `text`; rich's table of names is read only for a
    name that could be one (a time's `:02:` is not, a URL's `://host:` is not)."""
    names = [m.group(2).lower() for m in _EMOJI.finditer(text)]
    names = [n for n in names if n and not set(n) - EMOJI_ALPHABET and (not n.isdigit() or n in DIGIT_EMOJI)]
    if not names:
        return False
    from rich._emoji_codes import EMOJI  # a table only: not rich's console

    return any(name in EMOJI for name in names)


def _wrap(text: str, columns: int) -> list[str]:
    """rich's `Text.wrap` of one line of ASCII (`divide_line`, fold, `rstrip_end`, `truncate`)."""
    breaks: list[int] = []
    offset = 0
    for match in _WORD.finditer(text):
        start, word = match.start(), match.group(0)
        length = len(word.rstrip())
        if columns - offset >= length:
            offset += len(word)
        elif length > columns:
            chunks = [word[i:i + columns] for i in range(0, len(word), columns)]
            for i, chunk in enumerate(chunks):
                if start:
                    breaks.append(start)
                if i == len(chunks) - 1:
                    offset = len(chunk)
                else:
                    start += len(chunk)
        elif offset and start:
            breaks.append(start)
            offset = len(word)
    lines = [text[a:b] for a, b in zip([0, *breaks], [*breaks, len(text)], strict=True)]
    out = []
    for line in lines:
        if len(line) > columns:
            spaces = len(line) - len(line.rstrip())
            line = line[:len(line) - min(spaces, len(line) - columns)]
        out.append(line[:columns])
    return out
