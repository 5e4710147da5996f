"""The environment is read in one place: `corral.environment`. No other module of libs/, contracts/
or services/ touches `os.environ` (nor `os.getenv`, `os.putenv`, `from os import environ`), so the
variables that configure a process are found, defaulted and parsed where they are asked for there.

The allow-list names each exception and why it stands.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = {"libs/corral": "corral", "contracts": "corral/contracts", "services": "corral/services"}

#: Modules that read the environment themselves, each with its reason.
ALLOWED = {
    "corral/environment.py": "the one module that reads it",
    "corral/worker.py": "runs inside a job and imports only the standard library and the worker protocol "
                        "(import-linter): it reads the variables the node agent sets for the job",
    "corral/cli/fast.py": "the hot commands' entry point (`corral.cli.entry` runs it before anything else): "
                          "it takes the connection from the flags, then the same variables as the context",
}
_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def reads(tree: ast.AST) -> list[int]:
    """Lines that touch the process environment through `os`."""
    found = []
    for node in ast.walk(tree):
        through_os = isinstance(node, ast.Attribute) and node.attr in _NAMES and isinstance(node.value, ast.Name) \
            and node.value.id == "os"
        imported = isinstance(node, ast.ImportFrom) and node.module == "os" \
            and any(a.name in _NAMES for a in node.names)
        if through_os or imported:
            found.append(node.lineno)
    return found


def modules() -> dict[str, Path]:
    out = {}
    for folder, name in ROOTS.items():
        for path in (REPO / folder).rglob("*.py"):
            out[f"{name}/{path.relative_to(REPO / folder).as_posix()}"] = path
    return out


def test_only_the_environment_module_reads_the_environment() -> None:
    found = {name: lines for name, path in sorted(modules().items())
             if name not in ALLOWED and (lines := reads(ast.parse(path.read_text())))}
    assert found == {}, f"read the environment through corral.environment (or allow-list it with why): {found}"


def test_every_allowed_module_exists_and_still_reads_it() -> None:
    known = modules()
    stale = [name for name in ALLOWED if name not in known or not reads(ast.parse(known[name].read_text()))]
    assert stale == []


def test_the_finder_sees_each_way_in() -> None:
    code = "import os\nfrom os import getenv\na = os.environ['X']\nb = os.getenv('Y')\nc = {**os.environ}\n"
    assert sorted(reads(ast.parse(code))) == [2, 3, 4, 5]


def test_the_environment_module_sits_below_every_floor() -> None:
    """It imports nothing of Corral: telemetry, the bus and the stack all read through it."""
    tree = ast.parse((REPO / "libs" / "corral" / "environment.py").read_text())
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m.startswith("corral")], imported
