"""The CLI's read model kept current by whichever service process holds the projector lease.

The problem: `corral jobs` folded the whole log on every call; the read model
(`corral.readmodel`) stores the folded view for the CLI, and some process must keep it current.
Every service process competes for one lease, as for the outbox relay (`corral.services.relay`),
so whichever service survives keeps the read model current; the projector's failures are
logged and retried, never a reason to stop the service (the CLI folds the log without it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import asyncpg

from corral.bus import UnavailableBackoff, is_unavailable
from corral.eventstore import EventStore
from corral.readmodel.projector import Projector
from corral.services.base import Service
from corral.services.lease import Lease
from corral.services.settings import Settings

log = logging.getLogger("corral.service")


async def project_forever(store: EventStore, settings: Settings, service: Service) -> None:
    """Keep the CLI's read model current (`corral.readmodel.projector`) whenever this process holds
    the projector lease; which process competes first follows `relay_wait()`, as for the relay."""
    lease = Lease(settings.postgres_dsn, f"corral:{settings.namespace}:projector")
    started = service.monotonic()
    backoff, failures = UnavailableBackoff(first=0.5, cap=5.0), 0
    try:  # a wait ended by a stop (cancelled) closes the connection it kept
        while True:
            if service.monotonic() - started < service.relay_wait():
                await asyncio.sleep(0.2)
                continue
            task: asyncio.Task[None] | None = None
            held = False
            try:
                if not await lease.try_acquire():  # the next try asks on the same connection
                    await asyncio.sleep(0.5 if service.relay_wait() == 0 else 1.0)
                    continue
                held = True
                log.info("%s: projecting the log for the CLI", service.name)
                task = asyncio.create_task(Projector(store).run(), name="projector")
                while not task.done() and await lease.alive():
                    await asyncio.sleep(1.0)
                if task.done():
                    task.result()  # raises what stopped it
            except Exception as exc:
                # The read model is a shortcut (the CLI folds the log without it): whatever stops the
                # projector is logged and retried, never a reason to stop the service.
                failures += 1
                delay = backoff.delay(failures)
                expected = is_unavailable(exc) or isinstance(exc, asyncpg.PostgresError)
                log.log(logging.WARNING if expected else logging.ERROR, "projector: %s: %s; retrying in %.1fs",
                        type(exc).__name__, exc, delay, exc_info=not expected)
                await lease.release()  # the connection may be broken: the next try opens another
                await asyncio.sleep(delay)
            else:
                failures = 0
            finally:
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
                if held:
                    await lease.release()
    finally:
        await lease.release()
