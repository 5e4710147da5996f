"""No import cycles outside the core: every module of libs/, contracts/ and services/ (imports inside
functions included, `if TYPE_CHECKING:` blocks not) sits on a floor it can be read from.

import-linter checks the layers between packages on the installed wheel (CI); this reads the
source tree, so it also runs from an editable install, and it sees every module, not packages.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = {"corral": REPO / "libs" / "corral", "corral.contracts": REPO / "contracts",
         "corral.services": REPO / "services"}
#: The scheduling core's own cycle (one cycle module and its two helpers) is allowed: it is pure.
ALLOWED = ("corral.core.",)


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for name, root in ROOTS.items():
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([name, *parts])] = path
    return found


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node but those under `if TYPE_CHECKING:` (annotations only, never imported)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for orelse in node.orelse for n in (orelse, *_runtime_nodes(orelse)))
            continue
        yield node
        yield from _runtime_nodes(node)


def imports(module: str, path: Path, known: set[str]) -> set[str]:
    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            targets.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names)
    return {r for t in targets if t.startswith("corral") and (r := resolve(t)) and r != module}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            child = next(edges, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {module: imports(module, path, known) for module, path in found.items()}


def test_no_import_cycle_outside_the_core() -> None:
    outside = [c for c in cycles(graph()) if not all(m.startswith(ALLOWED) for m in c)]
    assert outside == [], f"import cycles (move the shared part below both): {outside}"


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_client_knows_no_gateway() -> None:
    """A person without a credential goes through the gateway by the CLI's choice."""
    assert not any(m.startswith("corral.gateway") for m in graph()["corral.client"])
