"""The `corral` program: the hot job commands without typer (`corral.cli.fast`), the rest through
typer's app (`corral.cli.main`)."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        if _fast(sys.argv[1:]):
            return
    except KeyboardInterrupt:
        sys.exit(130)
    from corral.cli.main import main as typer_main

    typer_main()


def _fast(args: list[str]) -> bool:
    from corral.cli.fast import run

    return run(args)


if __name__ == "__main__":
    main()
