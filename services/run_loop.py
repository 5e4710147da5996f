"""The run loop of a service process: connect, take the lease, rebuild, consume, reconcile.

Why: every service runs the same life, and its order matters (a service that consumed
before folding the log would decide on half the truth; a single writer that decided before its
lease would be two writers). It is written once, as named steps:
1. connect to Postgres (the event store; migrations applied) and NATS (streams declared), each
   waited for while it does not answer (`corral.services.waiting`), and
   start the telemetry endpoint (`corral.telemetry`: /metrics, /healthz, /readyz), the outbox
   relay task (`corral.services.relay`), the read model's projector (`projector_lease`) and the
   health beat;
2. `_take_lease`: a single-writer service (placement) blocks on its lease (`corral.services.lease`);
3. `service.rebuild()`: fold the whole log into a `ClusterView`, then `service.started()`;
4. `_consume`: its durable JetStream consumers, events (folded) and inbox requests (tracked);
5. `_reconcile_loop`: after each batch of changes (at most every `reconcile_interval`, and at
   least as long apart as the last reconcile took, unless the service paces itself), and on a
   tick, `_reconcile_once`: the service's `reconcile()`, an unavailable dependency waited out with
   a capped backoff.
A stop wakes the loop at once and no reconcile follows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from corral.bus import Bus, RunningConsumer, UnavailableBackoff, dependency_failure
from corral.bus.urls import addresses
from corral.eventstore import EventStore
from corral.health import start_beat
from corral.services.base import Service
from corral.services.lease import Lease
from corral.services.projector_lease import project_forever
from corral.services.relay import relay_forever
from corral.services.settings import DeliveryLimits, Settings
from corral.services.waiting import when_up
from corral.telemetry.health import Phase
from corral.telemetry.metrics import ServiceTelemetry

log = logging.getLogger("corral.service")


async def run_service(cls: type[Service], settings: Settings | None = None,
                      stop: asyncio.Event | None = None, **kwargs: Any) -> None:
    """Run one service until `stop` is set (or SIGTERM/SIGINT when run as a process)."""
    settings = settings or Settings.from_env()
    stop = stop or asyncio.Event()
    started = time.monotonic()
    opened = await when_up(cls.name, "Postgres", lambda: EventStore.open(settings.postgres_dsn), stop)
    if opened is None:
        return
    store = opened

    async def connect_bus() -> Bus:
        bus = await Bus.connect(settings.nats_url, settings.namespace, name=cls.name)
        try:
            await bus.ensure_streams()
        except BaseException:
            await bus.close()
            raise
        return bus

    connected = await when_up(cls.name, "NATS", connect_bus, stop, where=addresses(settings.nats_url))
    if connected is None:
        await store.close()
        return
    bus = connected
    # Each step of a start is logged with its time: a service that is slow to answer after a
    # start shows in its log which step it was in (connecting, waiting for its lease, folding).
    log.info("%s: connected to Postgres and NATS (namespace %s) in %.1fs", cls.name, settings.namespace,
             time.monotonic() - started)
    service = cls(store, bus, settings=settings, **kwargs)
    telemetry = ServiceTelemetry.attach(service, lease=cls.lease)  # /metrics, /healthz, /readyz
    await telemetry.start()
    relay = asyncio.create_task(relay_forever(store, bus, settings, service), name="relay-lease")
    projector = asyncio.create_task(project_forever(store, settings, service), name="projector-lease")
    health = start_beat(lambda: bool(bus.nc.is_connected))
    lease = Lease(settings.postgres_dsn, f"corral:{settings.namespace}:{cls.lease}") if cls.lease else None
    consumers: list[RunningConsumer] = []
    waker: asyncio.Task[None] | None = None
    try:
        if lease is not None and not await _take_lease(service, lease, stop, telemetry):
            return
        telemetry.phase(Phase.REBUILDING)
        folding = time.monotonic()
        await service.rebuild()
        await service.started()
        log.info("%s: folded the log to position %d in %.1fs", cls.name, service.view.position,
                 time.monotonic() - folding)
        consumers = await _consume(service, bus, settings.namespace)
        telemetry.consuming(consumers)
        log.info("%s: consuming (%s); started in %.1fs", cls.name, ", ".join(c.durable for c in consumers),
                 time.monotonic() - started)
        service.changed.set()
        # A stop wakes the loop like a change does, and no reconcile follows it: waiting for the
        # tick made every stop take up to a second, and placement could still place a job while
        # `corral up` was shutting down (the deciders stop first so that nothing is decided then).
        waker = asyncio.create_task(_set_when(stop, service.changed), name="stop-waker")
        await _reconcile_loop(service, lease, stop, telemetry)
    finally:
        await telemetry.stop()
        if waker is not None:
            waker.cancel()
        for c in consumers:
            with contextlib.suppress(Exception):
                await c.stop()
        for task in (relay, projector):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if health is not None:
            health.cancel()
        if lease is not None:
            await lease.release()
        await bus.close()
        await store.close()


async def _take_lease(service: Service, lease: Lease, stop: asyncio.Event, telemetry: ServiceTelemetry) -> bool:
    """Block until this process holds its service's lease (True) or is stopped first (False)."""
    log.info("%s: waiting for lease %s", service.name, lease.name)
    service.standby = not await lease.try_acquire_or_wait()
    telemetry.phase(Phase.STANDBY if service.standby else Phase.STARTING)
    acquire = asyncio.create_task(lease.acquire())
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({acquire, stopper}, return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    if stop.is_set():
        acquire.cancel()
        return False
    acquire.result()  # a bug's exception, raised here: never taken for holding the lease
    service.standby = False
    log.info("%s: holds lease %s", service.name, lease.name)
    return True


async def _consume(service: Service, bus: Bus, ns: str) -> list[RunningConsumer]:
    """The service's durable consumers: `<name>-events` (the types it `consumes`, else all) and,
    if it has an inbox, `<name>-inbox`."""
    cls = type(service)
    delivery = DeliveryLimits.from_env()
    consumers = [await bus.consume(
        f"{cls.name}-events",
        [f"{ns}.events.{t}" for t in cls.consumes] if cls.consumes is not None else [f"{ns}.events.*"],
        service.on_event, batch=256, max_deliver=delivery.events_max_deliver, backoff=delivery.backoff,
        linger=cls.events_linger, batch_handler=service.on_events)]
    if cls.inbox:
        consumers.append(await bus.consume(
            f"{cls.name}-inbox", [f"{ns}.inbox.{s}" for s in cls.inbox], service.on_inbox,
            batch=64, max_deliver=delivery.inbox_max_deliver, backoff=delivery.backoff,
            # Not paced: an inbox's batches are its commits (`append_handled`), and on a quiet
            # cluster no job's start waits behind its linger (a submission is a job's first hop,
            # the nodes' reports come after its start).
            linger=cls.inbox_linger, paced=False, batch_handler=service.on_inbox_batch))
        service.inbox_read_at = float("-inf")  # a backlog left by a previous leader is unread yet
        consumers[-1].clock, consumers[-1].caught_up = service.clock, service.inbox_caught_up
    return consumers


async def _set_when(stop: asyncio.Event, changed: asyncio.Event) -> None:
    await stop.wait()
    changed.set()


async def _reconcile_loop(service: Service, lease: Lease | None, stop: asyncio.Event,
                          telemetry: ServiceTelemetry) -> None:
    """Reconcile after changes and on every tick until stopped (or the lease is lost)."""
    last_reconcile, spent = float("-inf"), 0.0
    backoff, failures = UnavailableBackoff(), 0
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(service.changed.wait(), timeout=service.tick_seconds)
        pause = last_reconcile + max(service.reconcile_interval, 0.0 if service.paces_itself else spent) \
            - service.monotonic()
        if pause > 0 and not stop.is_set():
            await asyncio.sleep(pause)
        if stop.is_set():
            break
        service.changed.clear()
        last_reconcile = service.monotonic()
        if lease is not None and not await lease.alive():
            log.error("%s: lost lease %s; exiting so a standby takes over", service.name, lease.name)
            break
        telemetry.cycle_started()
        failed = await _reconcile_once(service)
        telemetry.cycle_ended()
        if failed is None:
            # The next reconcile waits at least as long as this one took: under a backlog a
            # reconcile (O(waiting jobs)) then takes at most half of the service's time, and
            # each one covers everything that arrived meanwhile. (Not for a service that paces
            # its costly part itself: `Service.paces_itself`.)
            spent = service.monotonic() - last_reconcile
            failures = 0
            continue
        # A dependency that does not answer (or a database error) is waited out with a capped
        # backoff: a reconcile that fails at once must not spin.
        failures += 1
        delay = backoff.delay(failures)
        log.warning("%s: reconcile failed (%s: %s); retrying in %.1fs", service.name, type(failed).__name__,
                    failed, delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)


async def _reconcile_once(service: Service) -> Exception | None:
    """One `reconcile()`: None if it went through, the error if a dependency was unavailable (or
    the database refused). Anything else is a bug and raises."""
    try:
        await service.reconcile()
    except Exception as exc:
        if not dependency_failure(exc):
            raise
        return exc
    return None
