"""Run import-linter on the source tree, in the layout the installed package has.

Why: setup.py maps three folders onto one `corral` package (libs/corral -> corral,
contracts -> corral.contracts, services -> corral.services). An editable install resolves the
mapped packages with a meta-path finder, but import-linter (grimp) finds modules by walking
`corral.__path__` on disk, where contracts/ and services/ are not: in the dev venv, a bare
`lint-imports` stops at "Module 'corral.services' does not exist".

So this builds a temporary tree of symlinks with the installed layout (from setup.py's ROOTS, so
there is one mapping), put it first on PYTHONPATH and run lint-imports with the repository's
pyproject.toml. CI also runs lint-imports on a non-editable install (.ci/run); this is the same
check on the working tree, for `make lint` and for anyone editing the layers.

Usage: .venv/bin/python .ci/lint_imports.py [lint-imports options]
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def package_roots() -> dict[str, str]:
    """setup.py's ROOTS (import name -> folder), read without running setup()."""
    tree = ast.parse((REPO / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "ROOTS" for t in node.targets):
            roots = ast.literal_eval(node.value)
            assert isinstance(roots, dict)
            return roots
    raise SystemExit("setup.py has no ROOTS mapping: update .ci/lint_imports.py")


def link_tree(into: Path) -> None:
    """Mirror the installed package under `into`: each mapped folder's entries, linked."""
    for name, folder in sorted(package_roots().items()):  # parents first: 'corral' < 'corral.services'
        target = into.joinpath(*name.split("."))
        if target.is_symlink():
            target.unlink()
        target.mkdir(parents=True, exist_ok=True)
        for entry in (REPO / folder).iterdir():
            if entry.name != "__pycache__" and not (target / entry.name).exists():
                (target / entry.name).symlink_to(entry)


def main() -> int:
    lint = Path(sys.executable).with_name("lint-imports")
    with tempfile.TemporaryDirectory(prefix="corral-lint-imports-") as tmp:
        link_tree(Path(tmp))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [tmp, os.environ.get("PYTHONPATH")]))}
        return subprocess.call([str(lint), "--config", str(REPO / "pyproject.toml"), *sys.argv[1:]],
                               env=env, cwd=tmp)


if __name__ == "__main__":
    sys.exit(main())
