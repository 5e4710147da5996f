"""The process environment: the one module of libs/, services/ and contracts/ that reads it.

Why one: a variable read in several places drifts (two defaults, two parsings), and nobody can
tell from one place what configures a process. Every module asks here (`get`, `mapping` for the
whole of it: what a child process inherits, or a `from_env` that reads several); an entry point
hands an option down with `put` (`corral service` to the service it runs). The services gather
theirs once per process into `corral.services.settings`, the node agent into its options.
tests/unit/test_environment_reads.py fails when another module reads `os.environ`; its allow-list
names the entry points and the job-side helper, with the reason for each.

Standard library only: every floor (telemetry, the bus, the stack, the services) may import it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def get(name: str, default: str | None = None) -> str | None:
    """The variable `name`, or `default` when it is unset."""
    return os.environ.get(name, default)


def mapping() -> Mapping[str, str]:
    """The whole environment, live (what a child process inherits, what a `from_env` reads)."""
    return os.environ


def put(name: str, value: str) -> None:
    """Set `name` for this process and what it starts: an entry point's option handed down."""
    os.environ[name] = value
