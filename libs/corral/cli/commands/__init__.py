"""What each `corral` command asks of the cluster: module-level functions over a `Client` that
return data, each importable and testable with a fake client (tests/unit/cli/commands/).

Why apart from the typer declarations: the declarations parse options and render rows, tables and
exit codes; these functions hold the command's work (what to read, what to request, what to wait
for), print nothing and import neither typer nor rich (tests/unit/cli/test_command_layer.py). A
request the cluster cannot take is a `CommandError`, which the declaration prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from corral.cli.exit_codes import ExitCode


class Problem(NamedTuple):
    """One problem of a file the command read: its field, what is wrong, and the fix."""

    path: str
    message: str
    hint: str | None = None


class CommandError(Exception):
    """What stops a command before or instead of its request: one line, the problems under it,
    and the exit code (1 unless said)."""

    def __init__(self, message: str, problems: Sequence[Problem] = (), code: ExitCode = ExitCode.FAILURE) -> None:
        super().__init__(message)
        self.message = message
        self.problems = tuple(problems)
        self.code = code
