"""The core stays readable: no module over 450 lines, no function over 60, no module-level state.

Why: a newcomer must be able to read each rule on its own; these limits keep it so. Module-level
assignments must be immutable (numbers, strings, tuples, frozensets, MappingProxyType tables,
getters, types): the core is pure, so any memo belongs to its caller.
"""

from __future__ import annotations

import ast
from pathlib import Path

import corral.core

CORE = Path(corral.core.__file__).resolve().parent
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60
_MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "deque", "Counter", "WeakValueDictionary"}


def _modules() -> list[Path]:
    found = sorted(CORE.rglob("*.py"))
    assert len(found) > 10, f"the core's modules were not found under {CORE}"
    return found


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def _is_mutable(value: ast.expr | None) -> bool:
    if isinstance(value, ast.Dict | ast.List | ast.Set | ast.DictComp | ast.ListComp | ast.SetComp):
        return True
    if isinstance(value, ast.Call):
        f = value.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        return name in _MUTABLE_CALLS
    return False


def test_no_core_module_is_over_450_lines() -> None:
    sizes = {p.relative_to(CORE).as_posix(): len(p.read_text().splitlines()) for p in _modules()}
    assert {m: n for m, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def test_no_core_function_is_over_60_lines() -> None:
    too_long = {}
    for p in _modules():
        for f in _functions(ast.parse(p.read_text())):
            n = (f.end_lineno or f.lineno) - f.lineno + 1
            if n > MAX_FUNCTION_LINES:
                too_long[f"{p.relative_to(CORE).as_posix()}:{f.lineno} {f.name}"] = n
    assert too_long == {}


def _targets(node: ast.Assign | ast.AnnAssign) -> list[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return [t.id for t in targets if isinstance(t, ast.Name)]


def test_the_core_keeps_no_module_level_mutable_state() -> None:
    found = []
    for p in _modules():
        name = p.relative_to(CORE).as_posix()
        tree = ast.parse(p.read_text())
        for node in tree.body:
            # `__all__`, the export list, is read by `import *` and linters and never changed
            assigned = isinstance(node, ast.Assign | ast.AnnAssign) and _targets(node) != ["__all__"]
            if assigned and _is_mutable(node.value):
                found.append(f"{name}:{node.lineno} {ast.unparse(node)[:60]}")
        found.extend(f"{name}:{n.lineno} global" for n in ast.walk(tree) if isinstance(n, ast.Global))
    assert found == []
