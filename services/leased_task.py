"""A task this process runs whenever it holds a named lease: the outbox relay, the CLI's projector.

The relay (`corral.services.relay`) and the projector (`corral.services.projector_lease`) run this
one loop: wait out the service's `relay_wait()`, try the lease (on one kept connection), run the
task while the lease is alive, give the lease back when the task stops or the lease is lost, back
off after a failure. The two differ only in what a failure means, an argument: the relay lets an
unexpected error end the process (a bug in publishing the log must be seen, and the process
restarted), the projector logs it and tries again (the read model is a shortcut: the CLI folds the
log without it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

from corral.bus import UnavailableBackoff, dependency_failure
from corral.services.base import Service
from corral.services.lease import Lease

log = logging.getLogger("corral.service")


class LeasedWork(Protocol):
    """What runs under the lease: `start` returns its task; `stop` ends it (a no-op when it is not
    running) and raises what ended it, if it failed."""

    def start(self) -> asyncio.Task[None]: ...

    async def stop(self) -> None: ...


async def run_while_leased(lease: Lease, service: Service, work: LeasedWork, *, name: str, doing: str,
                           fatal: Callable[[Exception], bool]) -> None:
    """Run `work` whenever this process holds `lease`, until cancelled; an exception for which
    `fatal` is true ends this (and is raised), any other is logged and retried with backoff."""
    started = service.monotonic()
    backoff, failures = UnavailableBackoff(first=0.5, cap=5.0), 0
    try:  # a wait ended by a stop (cancelled) closes the connection it kept
        while True:
            if service.monotonic() - started < service.relay_wait():
                await asyncio.sleep(0.2)
                continue
            held = False
            try:
                if not await lease.try_acquire():  # the next try asks on the same connection
                    await asyncio.sleep(0.5 if service.relay_wait() == 0 else 1.0)
                    continue
                held = True
                log.info("%s: %s", service.name, doing)
                task = work.start()
                while not task.done() and await lease.alive():
                    await asyncio.sleep(1.0)
                await work.stop()  # raises what ended the task, if it failed
            except Exception as exc:
                if fatal(exc):
                    raise
                failures += 1
                delay = backoff.delay(failures)
                expected = dependency_failure(exc)
                log.log(logging.WARNING if expected else logging.ERROR, "%s: %s: %s; retrying in %.1fs", name,
                        type(exc).__name__, exc, delay, exc_info=not expected)
                with contextlib.suppress(Exception):  # what ended it is said above
                    await work.stop()
                await lease.release()  # the connection may be broken: the next try opens another
                await asyncio.sleep(delay)
            else:
                failures = 0
            finally:
                if held:
                    await lease.release()
    finally:
        # A stop cancels this task in one of its waits: the work it started must stop too, or it
        # outlives the service and retries on a closed pool forever (in a test process, for every
        # later test). What ended it no longer matters here: this loop is over either way.
        with contextlib.suppress(Exception):
            await work.stop()
        await lease.release()
