"""The commands' work prints nothing: `corral.cli.commands` imports neither typer, click nor rich
(directly or through what it imports), nor the CLI's output and session modules; the typer
declarations parse options and render what these functions return."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

COMMANDS = Path(__file__).resolve().parents[3] / "libs" / "corral" / "cli" / "commands"
#: What a command's work never imports: the terminal, and the CLI modules that print or exit.
PRESENTATION = ("typer", "click", "rich", "corral.cli.output", "corral.cli.session", "corral.cli.verdict_report")
#: `why`'s module takes each event's summary from `corral.cli.job_commands`, which prints too:
#: it alone is checked by its own imports, not by what they load.
LOADS_THE_JOB_COMMANDS = ("jobs",)


def _imported(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def test_no_command_module_imports_the_terminal_or_prints() -> None:
    problems = []
    for path in sorted(COMMANDS.glob("*.py")):
        problems += [f"{path.name} imports {m}" for m in sorted(_imported(path))
                     if m.startswith(PRESENTATION)]
        problems += [f"{path.name} calls print" for node in ast.walk(ast.parse(path.read_text()))
                     if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print"]
    assert not problems, problems


def test_the_command_modules_load_no_terminal_library() -> None:
    modules = [p.stem for p in COMMANDS.glob("*.py") if p.stem != "__init__" and p.stem not in LOADS_THE_JOB_COMMANDS]
    code = ("import sys\n" + "".join(f"import corral.cli.commands.{m}\n" for m in sorted(modules)) +
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('typer', 'click', 'rich'))\n"
            "assert not loaded, loaded\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
