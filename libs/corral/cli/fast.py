"""The hot commands without typer: `corral submit FILE`, `jobs`, `show JOB`, `cancel JOB`,
`nodes` and one frame of `top`.

Why: importing typer and building a command costs a call ~40 ms of CPU, a quarter of a
`corral jobs`. Only plain arguments are taken here: the connection options before the command,
its one argument, `--json` (and `jobs`' `--all`, `nodes`' `--all`, `--rack RACK` and
`--state STATE`, `top`'s `--once`). Anything else (help, another option, a mistake, `top` live)
is left to typer, which says what is wrong. The work is done by the functions the typer commands
call (`corral.cli.job_commands`, `corral.cli.nodes_top`), with typer's defaults, so both
give the same output.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO, cast

#: The top-level options (the typer callback's in `corral.cli.main`) and their environment variables.
CONNECTION = {"--nats": "CORRAL_NATS_URL", "--postgres": "CORRAL_POSTGRES_DSN", "--namespace": "CORRAL_NAMESPACE",
              "--context": "CORRAL_CONTEXT"}
#: Each hot command's flags taken here, and how many arguments it takes.
FLAGS = {"submit": ("--json",), "jobs": ("--json", "--all", "-a"), "show": ("--json",), "cancel": ("--json",),
         "nodes": ("--json", "--all"), "top": ("--json", "--once")}
#: Each hot command's options that take a value (`--rack RACK` or `--rack=RACK`).
VALUED = {"nodes": ("--rack", "--state")}
ARGUMENTS = {"submit": 1, "jobs": 0, "show": 1, "cancel": 1, "nodes": 0, "top": 0}


@dataclass
class Call:
    command: str
    connection: dict[str, str] = field(default_factory=dict)
    arguments: list[str] = field(default_factory=list)
    flags: set[str] = field(default_factory=set)
    options: dict[str, str] = field(default_factory=dict)


def parse(args: Sequence[str]) -> Call | None:
    """The call `args` (argv without the program) makes, or None when it is not a plain hot one."""
    connection: dict[str, str] = {}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        name, eq, value = args[i].partition("=")
        if not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
        if name not in CONNECTION or name in connection or not value or value.startswith("-"):
            return None
        connection[name] = value
        i += 1 if eq else 2
    if i >= len(args) or args[i] not in FLAGS:
        return None
    call = Call(args[i], connection)
    rest = list(args[i + 1:])
    while rest:
        arg = rest.pop(0)
        name, eq, value = arg.partition("=")
        if name in VALUED.get(call.command, ()):
            if not eq:
                value = rest.pop(0) if rest else ""
            if name in call.options or not value or value.startswith("-"):
                return None
            call.options[name] = value
        elif arg.startswith("-") and arg != "-":
            if arg not in FLAGS[call.command]:
                return None
            call.flags.add(arg)
        else:
            call.arguments.append(arg)
    if call.command == "top" and not call.flags:
        return None  # top live: typer's
    return call if len(call.arguments) == ARGUMENTS[call.command] else None


def run(args: Sequence[str]) -> bool:
    """Run `args` here when it is a plain hot call (True), else do nothing (False)."""
    call = parse(args)
    if call is None:
        return False
    from corral.cli.session import ConnectionOptions

    def option(name: str) -> str | None:
        return call.connection.get(name) or os.environ.get(CONNECTION[name]) or None

    context = option("--context")
    ConnectionOptions.nats, ConnectionOptions.postgres = option("--nats"), option("--postgres")
    ConnectionOptions.namespace, ConnectionOptions.context = option("--namespace"), Path(context) if context else None
    json_out = "--json" in call.flags
    try:
        if call.command in ("nodes", "top"):
            from corral.cli import nodes_top

            if call.command == "nodes":
                nodes_top.nodes("--all" in call.flags, call.options.get("--rack"), call.options.get("--state"),
                                       json_out)
            else:
                nodes_top.top_once(json_out)
            return True
        from corral.cli import job_commands as commands

        if call.command == "submit":
            commands.submit(call.arguments[0], False, False, 600.0, False, json_out)
        elif call.command == "jobs":
            commands.jobs(None, None, None, bool(call.flags & {"--all", "-a"}), False, None, json_out)
        elif call.command == "show":
            commands.show(call.arguments[0], json_out)
        else:
            from corral.cli.verdict_report import VERDICT_WAIT

            commands.cancel(call.arguments[0], json_out, VERDICT_WAIT)
    except OSError as exc:  # as click does: a reader that went away (`| head`) ends the call quietly
        if exc.errno != errno.EPIPE:
            raise
        sys.stdout = cast(TextIO, _Quiet(sys.stdout))
        sys.stderr = cast(TextIO, _Quiet(sys.stderr))
        sys.exit(1)
    return True


class _Quiet:
    """A stream whose flush ignores a closed pipe (click's PacifyFlushWrapper)."""

    def __init__(self, wrapped: object) -> None:
        self.wrapped = wrapped

    def flush(self) -> None:
        try:
            self.wrapped.flush()  # type: ignore[attr-defined]
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise

    def __getattr__(self, name: str) -> object:
        return getattr(self.wrapped, name)
