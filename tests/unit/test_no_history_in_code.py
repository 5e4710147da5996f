"""Comments and docstrings give the standing reason in the present tense: no issue numbers, stops,
dates or "The problem: ... The fix: ..." stories (history belongs in commit messages and
bench/README.md)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = ("libs/corral", "services", "contracts", "bench")
#: Always refused: a reference to where or when a change was made.
REFERENCE = re.compile(r"(?i)\bissues?\s*#?\d+|\bstops?\s+\d+|\b20\d\d-[01]\d-[0-3]\d\b|\bbefore issue\b|"
                       r"\bsession\s+\d+")
#: A story of what went wrong before, told as one.
STORY = re.compile(r"(?m)^\s*(?:#:?\s*)?The (?:problem|fix):")


def _texts(path: Path) -> Iterator[tuple[int, str]]:
    source = path.read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno, doc


def _files() -> list[Path]:
    return [p for tree in TREES for p in sorted((ROOT / tree).rglob("*.py"))]


def test_no_comment_or_docstring_names_an_issue_a_stop_or_a_date() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}: {match.group(0)!r}"
             for path in _files() for line, text in _texts(path) for match in REFERENCE.finditer(text)]
    assert not found, "history in code (say the standing reason instead):\n" + "\n".join(found)


def test_no_docstring_tells_a_the_problem_story() -> None:
    telling = [f"{path.relative_to(ROOT)}:{line}" for path in _files() for line, text in _texts(path)
               if STORY.search(text)]
    assert not telling, "rewrite to the standing reason, in the present tense:\n" + "\n".join(telling)
