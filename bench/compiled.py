"""Build Corral with its pure core compiled by mypyc, for the benchmarks: the same source, in C.

Why: the core is plain, fully typed Python (mypy --strict clean, standard library only), which is
what mypyc compiles (it is how mypy and black ship). A replay spends ~95 % of its time in the core,
so compiling it is the cheapest constant factor there is, and it changes no decision: the compiled
and the interpreted core must write byte-identical `--json` schedules (bench/README.md records the
comparison). The project itself stays pure Python; nothing installs or imports this by default.

The build goes to build/mypyc/ (git-ignored): a copy of the whole `corral` package laid out as
setup.py maps it, with `corral/core/*.so` beside the sources (CPython prefers the extension). The
compiled modules are rebuilt only when the core's sources or the mypyc version change (~45 s);
the rest of the package is copied afresh on every use, so it is never stale.

MYPYC_OPT_LEVEL (mypyc's own variable, default 3) picks the C compiler's optimisation level. Any
other level than 3 builds into its own build/mypyc-O<level>/: the test suite's
smoke build (`MYPYC_OPT_LEVEL=0`, several times faster to compile) never stands in for the
optimised core the benchmarks time, nor replaces it.

Run: .venv/bin/python bench/compiled.py     (builds, prints the directory to put on PYTHONPATH)
     .venv/bin/python bench/sim_philly.py --compiled ...   (builds, then re-runs itself with it)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: `--smoke` (the test suite): -O0, the build checked, never its speed (see above).
OPT_LEVEL = "0" if "--smoke" in sys.argv[1:] else os.environ.get("MYPYC_OPT_LEVEL", "3")
OUT = ROOT / "build" / ("mypyc" if OPT_LEVEL == "3" else f"mypyc-O{OPT_LEVEL}")
# setup.py's package_dir: import name -> source folder
LAYOUT = {
    "corral": ROOT / "libs" / "corral",
    "corral/contracts": ROOT / "contracts",
    "corral/services": ROOT / "services",
}
CORE = ROOT / "libs" / "corral" / "core"
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so")


def _fingerprint() -> str:
    import mypy.version

    h = hashlib.sha256(f"mypyc {mypy.version.__version__} python {sys.version}".encode())
    for path in sorted(CORE.rglob("*.py")):  # the core has subpackages (core/preemption/)
        h.update(path.relative_to(CORE).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _compile_core(into: Path) -> None:
    """mypyc over a scratch copy of corral/core (it imports nothing outside the standard library)."""
    scratch = into / "src"
    shutil.rmtree(scratch, ignore_errors=True)
    (scratch / "corral").mkdir(parents=True)
    (scratch / "corral" / "__init__.py").write_text("")
    shutil.copytree(CORE, scratch / "corral" / "core", ignore=_IGNORE)
    print(f"compiling corral.core with mypyc -O{OPT_LEVEL} into {into} (about a minute at -O3) ...", file=sys.stderr,
          flush=True)
    # Every module of the core but its `__init__`, which stays interpreted: it imports each
    # re-exported name on first use (a module `__getattr__`), which a mypyc-compiled module
    # cannot have (the extension crashes at import).
    modules = sorted(p.relative_to(scratch).as_posix() for p in (scratch / "corral" / "core").rglob("*.py")
                     if p.relative_to(scratch).as_posix() != "corral/core/__init__.py")
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from mypyc.__main__ import main; sys.exit(main())", *modules],
        cwd=scratch,
        capture_output=True,
        text=True,
        env={**os.environ, "MYPYC_OPT_LEVEL": OPT_LEVEL},
    )
    if done.returncode != 0:
        raise SystemExit(f"mypyc failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    built = into / "ext"
    shutil.rmtree(built, ignore_errors=True)
    (built / "corral" / "core").mkdir(parents=True)
    for so in scratch.glob("*.so"):  # the shared runtime module mypyc emits for a multi-module build
        shutil.copy2(so, built / so.name)
    for so in (scratch / "corral" / "core").rglob("*.so"):
        target = built / "corral" / "core" / so.relative_to(scratch / "corral" / "core")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(so, target)
    shutil.rmtree(scratch)


def build() -> Path:
    """The directory to put first on sys.path for a compiled core; built or refreshed as needed."""
    stamp = OUT / "fingerprint"
    fingerprint = _fingerprint()
    if not stamp.is_file() or stamp.read_text() != fingerprint:
        OUT.mkdir(parents=True, exist_ok=True)
        _compile_core(OUT)
        stamp.write_text(fingerprint)
    site = OUT / "site"
    shutil.rmtree(site, ignore_errors=True)
    for name, source in LAYOUT.items():
        shutil.copytree(source, site / name, ignore=_IGNORE)
    shutil.copytree(OUT / "ext", site, dirs_exist_ok=True)
    return site


def reexec_compiled(argv: list[str]) -> None:
    """Run this script again with the compiled core first on the path (no return)."""
    site = build()
    env = dict(os.environ, CORRAL_COMPILED_SITE=str(site))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    os.execve(sys.executable, [sys.executable, *argv], env)


def core_kind() -> str:
    """'compiled' or 'interpreted': which core this process has imported."""
    import corral.core.cycle

    return "compiled" if (corral.core.cycle.__file__ or "").endswith(".so") else "interpreted"


if __name__ == "__main__":
    print(build())
