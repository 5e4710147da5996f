"""The base of the decision services: hooks, folding the log, appending, and building events.

Each service is only "fold events -> call the core -> append decisions"; the hard parts (rebuilding
after a crash, idempotent folding, optimistic concurrency, exactly-once inbox handling) and the
envelope of every event (stream, actor, correlation, time) live here once, so each service module
stays a page of domain logic:
- hooks a service overrides: `handle_inbox` / `handle_inbox_batch`, `folded`, `reconcile`,
  `started` (the run loop, `corral.services.run_loop`, calls them);
- folding: `rebuild` (the whole log), `on_event` (the bus; duplicates skipped by stream version,
  gaps re-read from the log), `refresh_stream`;
- appending: `append` (guarded by the folded versions; a lost race re-reads and returns False),
  `append_handled` (a batch of inbox messages in one commit);
- events: `new_event` fills the envelope from the service (actor = its name, the job's stream and
  correlation, time from its injected clock); `pending_event` is the one way a waiting job's
  reason becomes a PlacementPending (throttled by `corral.services.reason_throttle`).
Clocks are injected: `clock` (wall seconds, event times and the core's `now`) and `monotonic`
(intervals); nothing in a service reads the time any other way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar, TypeVar

from corral import core
from corral.bus import Bus, Delivery, Poison, is_unavailable
from corral.contracts import events as ev
from corral.contracts.envelope import Event, job_stream
from corral.contracts.problems import ContractError
from corral.contracts.registry import decode, encode
from corral.contracts.subjects import Subjects
from corral.eventstore import (
    AlreadyProcessed,
    ConcurrencyError,
    DuplicateEvent,
    EventStore,
    NewEvent,
    StoredEvent,
    Tracking,
)
from corral.projection import Applied, ClusterView, JobView
from corral.services.own_appends import Appending
from corral.services.reason_throttle import ReasonThrottle
from corral.services.senders import type_mismatch
from corral.services.settings import Settings
from corral.telemetry import logs
from corral.translate import wire_reason

log = logging.getLogger("corral.service")

E = TypeVar("E", bound=Event)


def to_new_event(event: Event) -> NewEvent:
    """A contract event as the store records it (envelope fields map one to one)."""
    return NewEvent(event_id=event.event_id, stream=event.stream, type=event.type,
                    schema_version=event.schema_version, data=encode(event),
                    correlation_id=event.correlation_id, causation_id=event.causation_id,
                    occurred_at=event.occurred_at)


class Service:
    """Base of the decision services. Subclasses set the class attributes and override hooks."""

    name: ClassVar[str] = "service"
    #: Event classes whose arrival may change this service's decisions (all are folded anyway;
    #: empty: every event it folds).
    events: ClassVar[frozenset[type[Event]]] = frozenset()
    #: The event types this service is sent (None: all of them): the types whose `flow` names it
    #: as a consumer (`corral.contracts.routes.consumed_by`). A service sent only some folds them
    #: with gaps in its stream versions (see `ClusterView.apply`): fewer messages for NATS to
    #: deliver and for the service to decode. Its appends are guarded by the versions it has seen,
    #: so an event it was not sent makes the append lose the race and re-read the stream.
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
    #: The run loop waits after a reconcile as long as it took (so that under a backlog it takes
    #: at most half of the service's time). A service whose reconcile has a cheap part that must
    #: not wait behind its costly part (quota: giving quota back, behind a reservation round over
    #: the whole backlog) paces the costly part itself and sets this.
    paces_itself: ClassVar[bool] = False
    #: The fold drops a job once it is over and holds nothing (`ClusterView.forget_ended`): memory
    #: O(active jobs + nodes), not O(log). A question about an ended job is answered from the log
    #: (admission: a submission repeating an ended job's id, `EventStore.jobs_of_submissions`;
    #: placement: a late report of an ended job, `forgotten_job`).
    forgets_ended_jobs: ClassVar[bool] = False
    #: The fold keeps which GPU holds what (`ClusterView.gpu_ledger`): nodes' allocations, fences of
    #: released attempts, rendezvous ports. Off for a service whose core snapshot leaves fenced GPUs
    #: out (quota, preemption): it is then not sent the nodes' GpusReleased.
    keeps_gpu_ledger: ClassVar[bool] = True
    #: The cluster's policy (`Settings.policy`, read once): quota, placement and preemption each
    #: decide their step of it (`corral.core.steps`); the default when run without settings.
    config: core.SchedulerConfig = core.SchedulerConfig()

    def __init__(self, store: EventStore, bus: Bus, *, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic, settings: Settings | None = None) -> None:
        self.store = store
        self.bus = bus
        #: wall-clock seconds: event times and the core's `now`
        self.clock = clock
        #: seconds for intervals (pacing, throttles): never goes back
        self.monotonic = monotonic
        self.settings = settings
        if settings is not None:  # the cluster's policy, read once with the settings
            self.config = settings.scheduler_config
        self.view = ClusterView(forget_ended=self.forgets_ended_jobs, gpu_ledger=self.keeps_gpu_ledger)
        self.changed = asyncio.Event()
        self.reasons = ReasonThrottle(monotonic, self.reason_refresh_seconds)
        #: streams with an append of this service under way: a copy of an event delivered on one
        #: meanwhile is folded after that append's batch (`corral.services.own_appends`)
        self.appending = Appending()
        #: set while `cold_fold` folds the log again: deliveries and requests wait for it
        self._refolding: asyncio.Event | None = None
        #: deliveries and requests being handled (`_admitted`): `cold_fold` waits for them to end,
        #: since each reads and folds into `self.view` after its awaits
        self._handling = 0
        #: the tasks handling them, each with its count: a cold fold from one would wait for itself
        self._handlers: dict[asyncio.Task[Any] | None, int] = {}
        self._idle = asyncio.Event()
        self._idle.set()

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
                with logs.handling([delivery]):  # JSON log lines: this request's job
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

    #: Every inbox request sent before this time (`clock`) has been handled: -inf while none is
    #: known to be, None when no inbox consumer says (a service driven without one: every request).
    inbox_read_at: float | None = None

    def inbox_caught_up(self, at: float) -> None:
        """The inbox consumer has handled every request sent before `at`."""
        self.inbox_read_at = at if self.inbox_read_at is None else max(self.inbox_read_at, at)

    #: Seconds after start before this process competes for the relay lease (see `corral.services.relay`).
    relay_after: ClassVar[float] = 3.0
    #: Set while this process waits for its service's lease: it has nothing else to do.
    standby: bool = False

    def relay_wait(self) -> float:
        return 0.0 if self.standby else self.relay_after

    def interested(self, event: Event) -> bool:
        return not self.events or type(event) in self.events

    #: A waiting job's reason is recorded again when its code changes, but when only its numbers
    #: change ("uses 117 of max 120 GPUs" -> "119 of 120") at most this often (see
    #: `corral.services.reason_throttle`).
    reason_refresh_seconds: ClassVar[float] = 5.0

    # ---- events ------------------------------------------------------------------------------
    def new_event(self, kind: type[E], *, stream: str | None = None, actor: str | None = None,
                  causation: Event | None = None, correlation_id: str | None = None, **payload: Any) -> E:
        """An event of `kind` from this service, its envelope filled: `stream` defaults to the
        job's (`job_id`, else `victim_job_id`), `actor` to the service's name, the correlation to
        the cause's, else to the job or node it is about, and the time to the service's clock."""
        about = payload.get("job_id") or payload.get("victim_job_id")
        if stream is None:
            if not about:
                raise ValueError(f"{kind.__name__}: give a stream (no job_id to derive it from)")
            stream = job_stream(about)
        if correlation_id is None and causation is None:
            correlation_id = about or payload.get("node")
        return kind.new(stream=stream, actor=actor or self.name, causation=causation,
                        correlation_id=correlation_id, now=datetime.fromtimestamp(self.clock(), UTC), **payload)

    def pending_event(self, job: JobView, reason: core.Reason) -> ev.PlacementPending | None:
        """The PlacementPending that records why `job` waits, or None when that is not news
        (the one reason throttle, `ReasonThrottle`)."""
        if not self.reasons.news(job.job_id, job.reason, reason.code, reason.message):
            return None  # (asked of every waiting job each round: the answer "no" costs no more)
        if len(self.reasons) > 2 * len(self.view.active) + 1024:
            self.reasons.retain(self.view.active)
        return self.new_event(ev.PlacementPending, job_id=job.job_id, reason=wire_reason(reason))

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

    async def cold_fold(self) -> None:
        """Fold the whole log again into a new view, as a new leader does: for a view found
        breaking an invariant of the fold (what this process holds is not what the log says).
        Events delivered and requests received meanwhile wait, then meet the new view (an event
        the fold read already is a duplicate by its stream version). Those already being handled
        end on the old view first: folded into the new one while the log is read into it, an
        event would be folded out of the log's order, or, for a reader folding past gaps
        (`consumes`), move its stream's version past events the fold then skips."""
        if asyncio.current_task() in self._handlers:
            raise RuntimeError("cold_fold waits for every delivery and request being handled to end: "
                               "called while handling one, it would wait for itself; call it from reconcile")
        while self._refolding is not None:
            await self._refolding.wait()
        gate = self._refolding = asyncio.Event()
        try:
            while self._handling:
                self._idle.clear()
                await self._idle.wait()
            self.view = ClusterView(forget_ended=self.forgets_ended_jobs, gpu_ledger=self.keeps_gpu_ledger)
            await self.rebuild()
            self.refolded()
        finally:
            self._refolding = None
            gate.set()

    def refolded(self) -> None:
        """Hook: `cold_fold` replaced the view; rebuild what the service keeps of the old one."""

    async def _admitted(self) -> None:
        """Wait out a cold fold, then count a delivery or request in as being handled (`_done`)."""
        while self._refolding is not None:
            await self._refolding.wait()
        self._handling += 1
        task = asyncio.current_task()
        self._handlers[task] = self._handlers.get(task, 0) + 1

    def _done(self) -> None:
        task = asyncio.current_task()
        if self._handlers[task] == 1:
            del self._handlers[task]
        else:
            self._handlers[task] -= 1
        self._handling -= 1
        if not self._handling:
            self._idle.set()

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

    async def forgotten_job(self, job_id: str) -> JobView | None:
        """A job this fold forgot (`forgets_ended_jobs`: over and holding nothing), as its stream
        in the log says it ended; None for a job it never forgot. What a question about an ended
        job (a late report of it) reads, so the fold keeps active jobs only."""
        if job_id not in self.view.forgotten:
            return None
        scratch = ClusterView()
        for stored in await self.store.read_stream(job_stream(job_id)):
            with contextlib.suppress(ContractError):
                scratch.apply(decode(stored.data), stored.version, stored.position)
        return scratch.jobs.get(job_id)

    async def on_event(self, delivery: Delivery) -> None:
        version = int(delivery.headers.get("Corral-Stream-Version", "0")) or None
        stream = delivery.headers.get("Corral-Stream")
        await self._admitted()
        try:
            if stream is not None and self.appending.busy(stream):
                await self.appending.settled(stream)  # (its copy of our own batch must not overtake it)
            if version is not None and stream is not None and version <= self.view.versions.get(stream, 0):
                # Folded already (most often this service's own append, folded when it was written,
                # coming back over the bus): the fold would skip it, so it is not decoded either.
                return
            try:
                event = decode(delivery.data)
            except ContractError as exc:
                raise Poison(f"undecodable event on {delivery.subject}: {exc}") from exc
            result = self.view.apply(event, version, gaps=self.consumes is not None)
            if result is Applied.GAP:
                await self.refresh_stream(event.stream)
                result = Applied.APPLIED
            elif result is Applied.APPLIED:
                self.folded(event)
            if result is Applied.APPLIED and self.interested(event):
                self.changed.set()
        finally:
            self._done()

    async def on_events(self, deliveries: list[Delivery]) -> list[BaseException | None]:
        """A fetched batch of events, folded in order (`on_event` each): one outcome per event.

        One call per batch rather than per event: the consumer's per-message handling (a trace
        and log context, a closure) cost as much as folding an event. An event that meets an
        unavailable dependency (its stream re-read from the log) is held with every event after
        it, so that they are folded again in their order once it answers."""
        outcomes: list[BaseException | None] = [None] * len(deliveries)
        for index, delivery in enumerate(deliveries):
            try:
                await self.on_event(delivery)
            except Exception as exc:
                if is_unavailable(exc):
                    outcomes[index:] = [exc] * (len(deliveries) - index)
                    break
                outcomes[index] = exc
        return outcomes

    async def handle_undecodable(self, delivery: Delivery, error: ContractError) -> bool:
        """A request that does not decode: True if this service answered it (it is acknowledged),
        False to dead-letter it (the default)."""
        return False

    async def on_inbox(self, delivery: Delivery) -> None:
        await self._admitted()
        try:
            try:
                event = decode(delivery.data)
            except ContractError as exc:
                if await self.handle_undecodable(delivery, exc):
                    self.changed.set()
                    return
                raise Poison(f"undecodable request on {delivery.subject}: {exc}") from exc
            mismatch = type_mismatch(Subjects(self.bus.namespace), delivery.subject, event)
            if mismatch is not None:
                raise Poison(f"request refused: {mismatch}")
            await self._own_appends_settled([event])
            await self.handle_inbox(event, delivery)
            self.changed.set()
        finally:
            self._done()

    async def on_inbox_batch(self, deliveries: list[Delivery]) -> list[BaseException | None]:
        await self._admitted()
        try:
            outcomes: list[BaseException | None] = [None] * len(deliveries)
            items: list[tuple[Event, Delivery]] = []
            where: list[int] = []
            subjects = Subjects(self.bus.namespace)
            for index, delivery in enumerate(deliveries):
                try:
                    event = decode(delivery.data)
                except ContractError as exc:
                    try:
                        if await self.handle_undecodable(delivery, exc):
                            continue
                        outcomes[index] = Poison(f"undecodable request on {delivery.subject}: {exc}")
                    except Exception as failed:
                        outcomes[index] = failed
                    continue
                mismatch = type_mismatch(subjects, delivery.subject, event)
                if mismatch is not None:
                    outcomes[index] = Poison(f"request refused: {mismatch}")
                    continue
                items.append((event, delivery))
                where.append(index)
            if items:
                await self._own_appends_settled([event for event, _ in items])
                for index, outcome in zip(where, await self.handle_inbox_batch(items), strict=True):
                    outcomes[index] = outcome
                self.changed.set()
            return outcomes
        finally:
            self._done()

    async def _own_appends_settled(self, requests: Sequence[Event]) -> None:
        """Wait for this service's appends under way to the streams of the jobs `requests` name.

        A request can answer an append of this service before that append has returned and been
        folded (a node reports the start of a gang whose reservation placement is still
        appending: the relay published it at the commit); the request then meets the batch's view,
        not the one before it."""
        for request in requests:
            job_id = getattr(request, "job_id", None)
            if isinstance(job_id, str) and self.appending.busy(stream := job_stream(job_id)):
                await self.appending.settled(stream)

    # ---- appending ---------------------------------------------------------------------------
    async def append(self, batches: Mapping[str, Sequence[Event]], *,
                     tracking: Tracking | None = None, expected: Mapping[str, int] | None = None) -> bool:
        """Append events to their streams guarded by the versions this service has folded.

        On success the events are folded at once (they come back over the bus later and are
        skipped as duplicates). On a lost race the streams are re-read and False is returned: the
        next reconcile decides again on fresh state. A tracking row makes the append exactly-once;
        with nothing to append it is recorded alone: the request was handled and changed nothing,
        which is its sender's answer (`corral.verdicts`).
        """
        plan = {stream: ((expected or {}).get(stream, self.view.versions.get(stream, 0)),
                         [to_new_event(e) for e in events])
                for stream, events in batches.items() if events}
        if not plan:
            if tracking is not None:
                await self.store.append_multi({}, tracking=tracking)
            return True
        written = await self._written(batches, plan, lambda: self.store.append_multi(plan, tracking=tracking),
                                      "lost a race", "re-reading")
        return written is not False  # (None: the tracking row says it was handled before)

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
        written = await self._written(batches, plan, lambda: self.store.append_handled(plan, trackings),
                                      "batch lost a race", "handling one by one",
                                      refused=(DuplicateEvent, ValueError))  # ValueError: one event id twice
        return written is True

    async def _written(self, batches: Mapping[str, Sequence[Event]], plan: Mapping[str, tuple[int, list[NewEvent]]],
                       write: Callable[[], Awaitable[object]], lost: str, then: str, *,
                       refused: tuple[type[Exception], ...] = ()) -> bool | None:
        """`write` (the store's append of `plan`, each stream guarded by its expected version) with
        the streams marked as being appended to until `batches` is folded: True once written and
        folded; False if it lost a race (the streams re-read; logged as `lost`, then `then`) or
        raised one of `refused`; None if a tracking row says it was handled before (AlreadyProcessed)."""
        with self.appending.on(plan):
            try:
                result = await write()
            except ConcurrencyError as exc:
                log.info("%s: %s on %s (%s); %s", self.name, lost, exc.stream, exc, then)
                for stream in plan:
                    await self.refresh_stream(stream)
                return False
            except refused:
                return False
            if isinstance(result, AlreadyProcessed):
                return None
            self._fold_appended(batches, {stream: expected for stream, (expected, _) in plan.items()})
            return True

    def _fold_appended(self, batches: Mapping[str, Sequence[Event]], bases: Mapping[str, int]) -> None:
        for stream, events in batches.items():
            base = bases.get(stream, 0)
            for i, event in enumerate(events):
                if self.view.apply(event, base + i + 1) is Applied.APPLIED:
                    self.folded(event)
