"""The `corral` program: the hot job commands without typer (`corral.cli.fast`), the rest through
typer's app (`corral.cli.main`)."""

from __future__ import annotations

import sys
from typing import NoReturn


def main() -> None:
    try:
        if _fast(sys.argv[1:]):
            leave(0)
    except KeyboardInterrupt:
        sys.exit(130)
    except SystemExit as exc:  # a hot command's exit code
        leave(exc.code)
    from corral.cli.main import main as typer_main

    typer_main()


def _fast(args: list[str]) -> bool:
    from corral.cli.fast import run

    return run(args)


def leave(code: object) -> NoReturn:
    """End the process as `sys.exit(code)` does, without the interpreter's teardown: once the
    exit handlers have run (`atexit`: telemetry, logging) and the output is flushed, a hot command
    is done, and freeing every module's objects one by one would cost it ~10-15 ms of CPU for
    nothing. With other threads running, the usual exit (which waits for them)."""
    threading = sys.modules.get("threading")
    if threading is not None and threading.active_count() > 1:
        raise SystemExit(code)
    import atexit
    import os

    if code is None or isinstance(code, int):
        status = int(code or 0)
    else:
        print(code, file=sys.stderr)
        status = 1
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        status = status or 120  # as the interpreter says an output it could not flush
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(status)


if __name__ == "__main__":
    main()
