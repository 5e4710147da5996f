"""The entry point of `python -m corral.services.<name>`: logging, GC tuning, signals, the run loop.

Each service's `__main__` sets up a process the same way (log format and level from
`CORRAL_LOG_LEVEL` and `CORRAL_LOG_FORMAT`, the collector tuned for a busy process, SIGTERM/SIGINT
as a clean stop): written once here, each `__main__` is one line.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from corral.collector import tune_for_busy_process
from corral.profiling import profiled
from corral.services.base import Service
from corral.services.run_loop import run_service
from corral.telemetry import logs


def main(cls: type[Service], **kwargs: Any) -> None:
    """Entry point of `python -m corral.services.<name>`: run until SIGTERM/SIGINT."""
    logs.configure(cls.name)  # text, or JSON lines with CORRAL_LOG_FORMAT=json
    tune_for_busy_process()

    async def _main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_service(cls, stop=stop, **kwargs)

    with profiled(cls.name):  # CORRAL_PROFILE_DIR: a cProfile of the whole run
        asyncio.run(_main())
