"""Comments and docstrings give the standing reason in the present tense: no issue numbers, stops,
dates or "Problem: ... The fix: ..." stories (history belongs in commit messages and
bench/README.md). Only comments and docstrings are read: a date literal used as data is not
history."""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = ("libs/corral", "services", "contracts", "bench", "tests", ".ci")
#: Always refused: a reference to where or when a change was made.
REFERENCE = re.compile(r"(?i)\bissues?\s*#?\d+|\bstops?\s+\d+|\b20\d\d-[01]\d-[0-3]\d\b|\bbefore issue\b|"
                       r"\bsession\s+\d+")
#: A story of what went wrong before, told as one.
STORY = re.compile(r"(?m)^\s*(?:#:?\s*)?(?:The )?(?:problem|fix):", re.IGNORECASE)
_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _docstrings(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Module, class and function docstrings, and attribute docstrings (a bare string that follows
    an assignment in a module or class body)."""
    for node in ast.walk(tree):
        if not isinstance(node, _DOCUMENTED):
            continue
        doc = ast.get_docstring(node, clean=False)
        if doc:
            yield node.body[0].lineno, doc
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for before, stmt in zip(node.body, node.body[1:], strict=False):
            if (isinstance(before, ast.Assign | ast.AnnAssign) and isinstance(stmt, ast.Expr)
                    and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)):
                yield stmt.lineno, stmt.value.value


@functools.cache
def _texts(path: Path) -> tuple[tuple[int, str], ...]:
    """The comments and docstrings of a file, with their line numbers (read once per run)."""
    source = path.read_text()
    comments = [(token.start[0], token.string) for token in tokenize.generate_tokens(io.StringIO(source).readline)
                if token.type == tokenize.COMMENT]
    return (*comments, *_docstrings(ast.parse(source)))


def _files() -> list[Path]:
    return [p for tree in TREES for p in sorted((ROOT / tree).rglob("*.py"))
            if ".venv" not in p.parts and "__pycache__" not in p.parts]


def test_no_comment_or_docstring_names_an_issue_a_stop_or_a_date() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}: {match.group(0)!r}"
             for path in _files() for line, text in _texts(path) for match in REFERENCE.finditer(text)]
    assert not found, "history in code (say the standing reason instead):\n" + "\n".join(found)


def test_no_docstring_tells_a_problem_story() -> None:
    telling = [f"{path.relative_to(ROOT)}:{line}" for path in _files() for line, text in _texts(path)
               if STORY.search(text)]
    assert not telling, "rewrite to the standing reason, in the present tense:\n" + "\n".join(telling)


def test_attribute_docstrings_are_read() -> None:
    tree = ast.parse('X = 1\n"""X counts agents before issue 15."""\n')
    assert any(REFERENCE.search(text) for _, text in _docstrings(tree))


def test_a_date_literal_used_as_data_is_not_read() -> None:
    tree = ast.parse('ROW = "2017-09-04 10:00:00"\nassert f(ROW) == "2026-12-07T00:00:00"\n')
    assert not [text for _, text in _docstrings(tree) if REFERENCE.search(text)]
