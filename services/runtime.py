"""What every Corral service shares: connect, rebuild from the log, consume, decide, append.

Why: each service is only "fold events → call the core → append decisions". The hard parts —
rebuilding after a crash, idempotent folding, optimistic concurrency, the outbox relay, the
single-writer lease — live here once, so each service module stays a page of domain logic.

Life of a service process:
1. connect to Postgres (the event store; migrations applied) and NATS (streams declared);
2. take its lease if it is a single-writer service (placement), blocking while another holds it;
3. fold the whole log into a `ClusterView` (`read_all`);
4. consume its durable JetStream consumers: events (folded; duplicates skipped by stream
   version, gaps re-read from the log) and inbox requests (a tracking row per message; admission
   and placement record a whole fetched batch in one commit);
5. after each batch of changes (at most every `reconcile_interval`), and on a tick, `reconcile()`:
   decide with the core and append.
Every process also runs the outbox relay under a separate lease, so whichever service survives
keeps publishing the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import asyncpg

from corral.bus import Bus, Delivery, OutboxRelay, Poison, UnavailableBackoff, is_unavailable
from corral.collector import tune_for_busy_process
from corral.contracts.envelope import Event
from corral.contracts.problems import ContractError
from corral.contracts.registry import decode, encode
from corral.eventstore import (
    AlreadyProcessed,
    ConcurrencyError,
    DuplicateEvent,
    EventStore,
    NewEvent,
    StoredEvent,
    Tracking,
)
from corral.health import start_beat
from corral.projection import Applied, ClusterView, JobView

log = logging.getLogger("corral.service")


def to_new_event(event: Event) -> NewEvent:
    """A contract event as the store records it (envelope fields map one to one)."""
    return NewEvent(event_id=event.event_id, stream=event.stream, type=event.type,
                    schema_version=event.schema_version, data=encode(event),
                    correlation_id=event.correlation_id, causation_id=event.causation_id,
                    occurred_at=event.occurred_at)


@dataclass(frozen=True)
class Settings:
    """Where a service finds its infrastructure; read from the environment that `corral up` sets."""

    nats_url: str
    postgres_dsn: str
    namespace: str = "corral"
    log_dir: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        missing = [k for k in ("CORRAL_NATS_URL", "CORRAL_POSTGRES_DSN") if not env.get(k)]
        if missing:
            raise SystemExit(f"set {' and '.join(missing)} (or start everything with `corral up`)")
        return cls(nats_url=env["CORRAL_NATS_URL"], postgres_dsn=env["CORRAL_POSTGRES_DSN"],
                   namespace=env.get("CORRAL_NAMESPACE", "corral"), log_dir=env.get("CORRAL_LOG_DIR"))


@dataclass(frozen=True)
class DeliveryLimits:
    """How often a service's consumers retry a message that fails (bad input or a bug) before
    dead-lettering it, and the delays between tries. From the environment, so tests and operators
    can shorten or lengthen the window: CORRAL_MAX_DELIVER (both consumers), CORRAL_RETRY_BACKOFF
    (comma-separated seconds)."""

    events_max_deliver: int = 10
    inbox_max_deliver: int = 5
    backoff: tuple[float, ...] = (0.5, 2.0, 10.0, 30.0)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DeliveryLimits:
        env = os.environ if environ is None else environ
        limits = cls()
        if env.get("CORRAL_MAX_DELIVER"):
            n = int(env["CORRAL_MAX_DELIVER"])
            limits = DeliveryLimits(events_max_deliver=n, inbox_max_deliver=n, backoff=limits.backoff)
        if env.get("CORRAL_RETRY_BACKOFF"):
            backoff = tuple(float(x) for x in env["CORRAL_RETRY_BACKOFF"].split(",") if x.strip())
            limits = DeliveryLimits(limits.events_max_deliver, limits.inbox_max_deliver, backoff)
        return limits


class Lease:
    """A Postgres session advisory lock: held while the connection lives, freed when the holder dies
    (even by kill -9, when the server notices the closed socket). One writer per resource."""

    def __init__(self, dsn: str, name: str) -> None:
        self.dsn = dsn
        self.name = name
        self.key = zlib.crc32(name.encode()) & 0x7FFFFFFF
        self._conn: Any = None

    async def try_acquire(self) -> bool:
        if self._conn is None or self._conn.is_closed():
            self._conn = await asyncpg.connect(self.dsn)
        got = bool(await self._conn.fetchval("SELECT pg_try_advisory_lock($1)", self.key))
        return got

    async def acquire(self, poll: float = 0.5) -> None:
        while not await self.try_acquire():
            await asyncio.sleep(poll)

    async def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            try:
                await conn.close(timeout=2.0)
            except Exception:  # the server is gone: drop the socket
                conn.terminate()

    async def alive(self) -> bool:
        """Still ours? A lost database connection means the lease may be someone else's now."""
        if self._conn is None or self._conn.is_closed():
            return False
        try:
            await self._conn.fetchval("SELECT 1")
            return True
        except Exception as exc:
            if is_unavailable(exc) or isinstance(exc, asyncpg.PostgresError):
                return False
            raise


class Service:
    """Base of the decision services. Subclasses set the class attributes and override hooks."""

    name: ClassVar[str] = "service"
    #: Event types whose arrival may change this service's decisions (all are folded anyway).
    events: ClassVar[tuple[str, ...]] = ()
    #: The event types this service is sent (None: all of them). A service that needs only a few
    #: folds those with gaps in its stream versions (see `ClusterView.apply`): fewer messages for
    #: NATS to deliver and for the service to decode. Only for services that append to streams
    #: they do not follow (new ones) or rarely (a lost race just re-reads the stream).
    consumes: ClassVar[tuple[str, ...] | None] = None
    #: Inbox subjects (after `<ns>.inbox.`) this service handles.
    inbox: ClassVar[tuple[str, ...]] = ()
    #: Single-writer services take this lease before consuming anything.
    lease: ClassVar[str | None] = None
    tick_seconds: ClassVar[float] = 1.0
    #: How long a consumer waits after a partial batch before fetching again (see `Bus.consume`):
    #: every fetch, confirmed ack and reconcile has a fixed cost, so under a stream of events a
    #: few milliseconds of gathering make each of them cover many events.
    events_linger: ClassVar[float] = 0.02
    inbox_linger: ClassVar[float] = 0.01
    #: At least this long between two reconciles: each one looks at every waiting job, so running
    #: it after every small batch cost O(waiting) per event under load.
    reconcile_interval: ClassVar[float] = 0.02

    def __init__(self, store: EventStore, bus: Bus, *, clock: Callable[[], float] = time.time,
                 settings: Settings | None = None) -> None:
        self.store = store
        self.bus = bus
        self.clock = clock
        self.settings = settings
        self.view = ClusterView()
        self.changed = asyncio.Event()
        self._reasons_said: dict[str, float] = {}

    # ---- hooks -------------------------------------------------------------------------------
    def tracking(self, delivery: Delivery) -> Tracking:
        """The tracking row that makes handling this inbox message an exactly-once effect: keyed by
        the publisher's message id (Nats-Msg-Id), else by the message's place in its stream."""
        return Tracking(self.name, delivery.msg_id or f"{delivery.stream}:{delivery.stream_sequence}")

    async def handle_inbox(self, event: Event, delivery: Delivery) -> None:
        """An inbox request; append its effects with `self.append(..., tracking=...)`."""

    async def handle_inbox_batch(self, items: Sequence[tuple[Event, Delivery]]) -> list[BaseException | None]:
        """A fetched batch of inbox requests; one outcome per request (None: handled).

        By default each is handled on its own (`handle_inbox`). A service that can decide several
        at once appends their effects together with `append_handled` (one commit per batch) and
        falls back to this for the batch if that append does not go through."""
        outcomes: list[BaseException | None] = []
        for event, delivery in items:
            try:
                await self.handle_inbox(event, delivery)
                outcomes.append(None)
            except Exception as exc:
                outcomes.append(exc)
        return outcomes

    def folded(self, event: Event) -> None:
        """Called for every event folded into `self.view` (from the log, the bus or own appends)."""

    async def reconcile(self) -> None:
        """Decide from `self.view` and append; called after changes and on every tick."""

    async def started(self) -> None:
        """Called once the log is folded and before consuming: extra subscriptions, timers."""

    #: Seconds after start before this process competes for the relay lease (see `_relay_forever`).
    relay_after: ClassVar[float] = 3.0
    #: Set while this process waits for its service's lease: it has nothing else to do.
    standby: bool = False

    def relay_wait(self) -> float:
        return 0.0 if self.standby else self.relay_after

    def interested(self, event: Event) -> bool:
        return not self.events or event.type in self.events

    #: A waiting job's reason is recorded again when its code changes, but when only its numbers
    #: change ("uses 117 of max 120 GPUs" -> "119 of 120") at most this often: otherwise every
    #: reservation rewrote the reason of every waiting job (130 events per job in Kueue's
    #: baseline shape), and the log spent its capacity on them.
    reason_refresh_seconds: ClassVar[float] = 5.0

    def reason_news(self, job: JobView, code: str, message: str) -> bool:
        """Whether this reason for `job` is worth a PlacementPending now (and remember if so)."""
        if job.reason is not None and job.reason.code == code:
            if job.reason.message == message:
                return False
            said = self._reasons_said.get(job.job_id)
            if said is not None and time.monotonic() - said < self.reason_refresh_seconds:
                return False
        self._reasons_said[job.job_id] = time.monotonic()
        return True

    # ---- folding -----------------------------------------------------------------------------
    async def rebuild(self) -> None:
        """Fold the whole log: a new process knows everything the log says before it acts."""
        after = 0
        while True:
            batch = await self.store.read_all(after, limit=2000)
            if not batch:
                break
            for stored in batch:
                self._fold_stored(stored)
            after = batch[-1].position

    def _fold_stored(self, stored: StoredEvent) -> None:
        try:
            event = decode(stored.data)
        except ContractError as exc:
            log.error("%s: cannot decode %s v%s at position %s: %s", self.name, stored.type,
                      stored.schema_version, stored.position, exc)
            return
        if self.view.apply(event, stored.version, stored.position) is Applied.APPLIED:
            self.folded(event)

    async def refresh_stream(self, stream: str) -> None:
        """Catch up one stream from the log (after a lost race or a gap in delivery)."""
        for stored in await self.store.read_stream(stream, self.view.versions.get(stream, 0) + 1):
            self._fold_stored(stored)

    async def on_event(self, delivery: Delivery) -> None:
        try:
            event = decode(delivery.data)
        except ContractError as exc:
            raise Poison(f"undecodable event on {delivery.subject}: {exc}") from exc
        version = int(delivery.headers.get("Corral-Stream-Version", "0")) or None
        result = self.view.apply(event, version, gaps=self.consumes is not None)
        if result is Applied.GAP:
            await self.refresh_stream(event.stream)
            result = Applied.APPLIED
        elif result is Applied.APPLIED:
            self.folded(event)
        if result is Applied.APPLIED and self.interested(event):
            self.changed.set()

    async def on_inbox(self, delivery: Delivery) -> None:
        try:
            event = decode(delivery.data)
        except ContractError as exc:
            raise Poison(f"undecodable request on {delivery.subject}: {exc}") from exc
        await self.handle_inbox(event, delivery)
        self.changed.set()

    async def on_inbox_batch(self, deliveries: list[Delivery]) -> list[BaseException | None]:
        outcomes: list[BaseException | None] = [None] * len(deliveries)
        items: list[tuple[Event, Delivery]] = []
        where: list[int] = []
        for index, delivery in enumerate(deliveries):
            try:
                items.append((decode(delivery.data), delivery))
                where.append(index)
            except ContractError as exc:
                outcomes[index] = Poison(f"undecodable request on {delivery.subject}: {exc}")
        if items:
            for index, outcome in zip(where, await self.handle_inbox_batch(items), strict=True):
                outcomes[index] = outcome
            self.changed.set()
        return outcomes

    # ---- appending ---------------------------------------------------------------------------
    async def append(self, batches: Mapping[str, Sequence[Event]], *,
                     tracking: Tracking | None = None, expected: Mapping[str, int] | None = None) -> bool:
        """Append events to their streams guarded by the versions this service has folded.

        On success the events are folded at once (they come back over the bus later and are
        skipped as duplicates). On a lost race the streams are re-read and False is returned: the
        next reconcile decides again on fresh state. A tracking row makes the append exactly-once.
        """
        plan = {stream: ((expected or {}).get(stream, self.view.versions.get(stream, 0)),
                         [to_new_event(e) for e in events])
                for stream, events in batches.items() if events}
        if not plan:
            return True
        try:
            result = await self.store.append_multi(plan, tracking=tracking)
        except ConcurrencyError as exc:
            log.info("%s: lost a race on %s (%s); re-reading", self.name, exc.stream, exc)
            for stream in plan:
                await self.refresh_stream(stream)
            return False
        if isinstance(result, AlreadyProcessed):
            return True
        self._fold_appended(batches, {stream: expected for stream, (expected, _) in plan.items()})
        return True

    async def append_handled(self, batches: Mapping[str, Sequence[Event]], trackings: Sequence[Tracking]) -> bool:
        """Append the effects of several inbox messages, with a tracking row each, in one commit.

        Guarded by the versions this service has folded. True if written (and folded). False if
        anything stood in the way — a lost race (streams re-read), a message handled before, a
        reused event id — and nothing was written: handle the messages one by one then, which
        sorts each case out exactly as before batching.
        """
        plan = {stream: (self.view.versions.get(stream, 0), [to_new_event(e) for e in events])
                for stream, events in batches.items() if events}
        if not plan and not trackings:
            return True
        try:
            result = await self.store.append_handled(plan, trackings)
        except ConcurrencyError as exc:
            log.info("%s: batch lost a race on %s (%s); handling one by one", self.name, exc.stream, exc)
            for stream in plan:
                await self.refresh_stream(stream)
            return False
        except (DuplicateEvent, ValueError):  # ValueError: one event id twice in the batch
            return False
        if isinstance(result, AlreadyProcessed):
            return False
        self._fold_appended(batches, {stream: expected for stream, (expected, _) in plan.items()})
        return True

    def _fold_appended(self, batches: Mapping[str, Sequence[Event]], bases: Mapping[str, int]) -> None:
        for stream, events in batches.items():
            base = bases.get(stream, 0)
            for i, event in enumerate(events):
                if self.view.apply(event, base + i + 1) is Applied.APPLIED:
                    self.folded(event)


async def _relay_forever(store: EventStore, bus: Bus, settings: Settings, service: Service) -> None:
    """Run the outbox relay whenever this process holds the relay lease.

    Which process relays matters under load: the relay shares its event loop with the service, and
    behind a service busy deciding (preemption's victim search, quota's fair share) every event
    reached the bus seconds late. So at start a process competes for the lease only after its
    service's `relay_wait()`: an idle placement standby at once, admission soon, the deciding
    services later. Once started, any process takes over a free lease (failover stays quick).
    """
    lease = Lease(settings.postgres_dsn, f"corral:{settings.namespace}:relay")
    relay = OutboxRelay(store, bus, lambda e: f"{settings.namespace}.events.{e.type}", name="relay",
                        linger=0.005)
    started = time.monotonic()
    backoff, failures = UnavailableBackoff(first=0.5, cap=5.0), 0
    while True:
        if time.monotonic() - started < service.relay_wait():
            await asyncio.sleep(0.2)
            continue
        try:
            if not await lease.try_acquire():
                await asyncio.sleep(0.5 if service.relay_wait() == 0 else 1.0)
                continue
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
            await asyncio.sleep(delay)
        else:
            failures = 0
        finally:
            await lease.release()


async def _set_when(stop: asyncio.Event, changed: asyncio.Event) -> None:
    await stop.wait()
    changed.set()


async def run_service(cls: type[Service], settings: Settings | None = None,
                      stop: asyncio.Event | None = None, **kwargs: Any) -> None:
    """Run one service until `stop` is set (or SIGTERM/SIGINT when run as a process)."""
    settings = settings or Settings.from_env()
    stop = stop or asyncio.Event()
    store = await EventStore.open(settings.postgres_dsn)
    bus = await Bus.connect(settings.nats_url, settings.namespace, name=cls.name)
    await bus.ensure_streams()
    service = cls(store, bus, settings=settings, **kwargs)
    relay = asyncio.create_task(_relay_forever(store, bus, settings, service), name="relay-lease")
    health = start_beat(lambda: bool(bus.nc.is_connected))
    lease = Lease(settings.postgres_dsn, f"corral:{settings.namespace}:{cls.lease}") if cls.lease else None
    consumers = []
    waker: asyncio.Task[None] | None = None
    try:
        if lease is not None:
            log.info("%s: waiting for lease %s", cls.name, lease.name)
            service.standby = not await lease.try_acquire()
            acquire = asyncio.create_task(lease.acquire())
            stopper = asyncio.create_task(stop.wait())
            await asyncio.wait({acquire, stopper}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if stop.is_set():
                acquire.cancel()
                return
            service.standby = False
            log.info("%s: holds lease %s", cls.name, lease.name)
        await service.rebuild()
        await service.started()
        ns = settings.namespace
        delivery = DeliveryLimits.from_env()
        consumers.append(await bus.consume(
            f"{cls.name}-events",
            [f"{ns}.events.{t}" for t in cls.consumes] if cls.consumes is not None else [f"{ns}.events.>"],
            service.on_event, batch=256, max_deliver=delivery.events_max_deliver, backoff=delivery.backoff,
            linger=cls.events_linger))
        if cls.inbox:
            consumers.append(await bus.consume(
                f"{cls.name}-inbox", [f"{ns}.inbox.{s}" for s in cls.inbox], service.on_inbox,
                batch=64, max_deliver=delivery.inbox_max_deliver, backoff=delivery.backoff,
                linger=cls.inbox_linger, batch_handler=service.on_inbox_batch))
        service.changed.set()
        # A stop wakes the loop like a change does, and no reconcile follows it: waiting for the
        # tick made every stop take up to a second, and placement could still place a job while
        # `corral up` was shutting down (the deciders stop first so that nothing is decided then).
        waker = asyncio.create_task(_set_when(stop, service.changed), name="stop-waker")
        last_reconcile, spent = float("-inf"), 0.0
        backoff, failures = UnavailableBackoff(), 0
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(service.changed.wait(), timeout=cls.tick_seconds)
            pause = last_reconcile + max(cls.reconcile_interval, spent) - time.monotonic()
            if pause > 0 and not stop.is_set():
                await asyncio.sleep(pause)
            if stop.is_set():
                break
            service.changed.clear()
            last_reconcile = time.monotonic()
            if lease is not None and not await lease.alive():
                log.error("%s: lost lease %s; exiting so a standby takes over", cls.name, lease.name)
                break
            try:
                await service.reconcile()
                # The next reconcile waits at least as long as this one took: under a backlog a
                # reconcile (O(waiting jobs)) then takes at most half of the service's time, and
                # each one covers everything that arrived meanwhile.
                spent = time.monotonic() - last_reconcile
                failures = 0
            except Exception as exc:
                # A dependency that does not answer (or a database error) is waited out with a
                # capped backoff: a reconcile that fails at once must not spin. Anything else is a bug.
                if not (is_unavailable(exc) or isinstance(exc, asyncpg.PostgresError)):
                    raise
                failures += 1
                delay = backoff.delay(failures)
                log.warning("%s: reconcile failed (%s: %s); retrying in %.1fs", cls.name, type(exc).__name__,
                            exc, delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
    finally:
        if waker is not None:
            waker.cancel()
        for c in consumers:
            with contextlib.suppress(Exception):
                await c.stop()
        relay.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await relay
        if health is not None:
            health.cancel()
        if lease is not None:
            await lease.release()
        await bus.close()
        await store.close()


def main(cls: type[Service], **kwargs: Any) -> None:
    """Entry point of `python -m corral.services.<name>`: run until SIGTERM/SIGINT."""
    logging.basicConfig(level=os.environ.get("CORRAL_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    tune_for_busy_process()

    async def _main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_service(cls, stop=stop, **kwargs)

    asyncio.run(_main())
