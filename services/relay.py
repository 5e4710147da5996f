"""The outbox relay of a service process: publish the log whenever this process holds the relay lease.

The problem: the log must reach the bus while any service process lives, and exactly one
process should publish it at a time. Every process runs this task; the relay lease (a
`corral.services.lease.Lease`) picks the publisher, and a survivor takes over when it dies.

Which process relays matters under load: the relay shares its event loop with the service, and
behind a service busy deciding (preemption's victim search, quota's fair share) every event
reached the bus seconds late. So at start a process competes for the lease only after its
service's `relay_wait()`: an idle placement standby at once, admission soon, the deciding
services later. Once started, any process takes over a free lease (failover stays quick).
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from corral.bus import Bus, OutboxRelay, UnavailableBackoff, is_unavailable
from corral.eventstore import EventStore
from corral.services.base import Service
from corral.services.lease import Lease
from corral.services.settings import Settings

log = logging.getLogger("corral.service")


async def relay_forever(store: EventStore, bus: Bus, settings: Settings, service: Service) -> None:
    """Run the outbox relay whenever this process holds the relay lease (see the module docstring)."""
    lease = Lease(settings.postgres_dsn, f"corral:{settings.namespace}:relay")
    relay = OutboxRelay(store, bus, lambda e: f"{settings.namespace}.events.{e.type}", name="relay",
                        linger=0.005)
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
                log.info("%s: relaying the log", service.name)
                task = relay.start()
                while not task.done() and await lease.alive():
                    await asyncio.sleep(1.0)
                await relay.stop()
            except Exception as exc:
                if not (is_unavailable(exc) or isinstance(exc, asyncpg.PostgresError)):
                    raise
                failures += 1
                delay = backoff.delay(failures)
                log.warning("relay lease: %s: %s; retrying in %.1fs", type(exc).__name__, exc, delay)
                await relay.stop()
                await lease.release()  # the connection may be broken: the next try opens another
                await asyncio.sleep(delay)
            else:
                failures = 0
            finally:
                if held:
                    await lease.release()
    finally:
        # A stop cancels this task in its wait above: the relay it started must stop too, or it
        # outlives the service and retries on a closed pool forever (in a test process, for every
        # later test).
        await relay.stop()
        await lease.release()
