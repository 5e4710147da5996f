"""The outbox relay: publishes the log's events to JetStream, in global-position order.

Why an outbox: a service appends its events to Postgres (the truth) and never publishes directly;
a crash between "append" and "publish" would otherwise lose the message. The relay reads the log
after its last saved position, publishes each event with `Nats-Msg-Id` = event_id, and saves the
new position in Postgres (`relay_positions`) only after JetStream acknowledged the publishes.

A crash before the save makes the next run publish some events again; JetStream drops them as
duplicates within the stream's duplicate window (2 minutes), and the position is saved at most
`save_every` seconds after a batch was acknowledged (`save_every=0`: after every batch), so the
window is never approached in practice. Consumers are idempotent (tracking) for anything beyond.
A service's relay saves at most a few times a second: a saved position is an UPDATE and a commit,
and at a hundred jobs a second its batches hold a few events each. Reading by position is safe
because the store hands positions out in commit order (see `corral.eventstore.store`): no
late-committing event is ever skipped.

One event must never stop the relay: an event larger than the bus takes (`Bus.max_message_bytes`,
or a publish the bus refuses for its size) is skipped with an `EventNotRelayed` alert appended to
stream `cluster` (position, type, size, limit), and the relay moves on. Before this, one 8 MiB
submission stopped the relay (and every relay that took over) for good. Admission keeps such
events out of the log in the first place (`corral.contracts.sizes`).

A relay given `types` publishes only events of those types (the services' relay: the types some
process is sent, `corral.contracts.routes.relayed_types`); the others (a node's GPU ledger, the
workers' reports placement records) are read from the log alone, and each would cost a publish, its
acknowledgement and its storage in the stream for no reader. `types` includes every type node
work is made of: the resume below takes an event of another type for one never published.

Run one relay per installation; two relays with the same name stay correct (duplicates are
dropped), they only waste work.

The bus may lose what it acknowledged: JetStream fsyncs its files once a second, not after every
message (`corral.stack.servers.NatsServer.sync_interval`), so a crash of the machine can take the
stream's last second with it while the saved position says it was published. Every run therefore
starts after the newest event the bus still holds when that is older than the saved position
(`resume_position`): the lost tail is published again, in order, and what survived is dropped as
a duplicate.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Collection
from dataclasses import replace

import nats.errors
import nats.js.errors
from nats.js.errors import APIError

from corral.bus.bus import Bus, Outgoing
from corral.bus.delivery import MSG_ID
from corral.bus.naming import EVENTS
from corral.bus.pacing import Linger
from corral.bus.unavailable import UnavailableBackoff, is_unavailable
from corral.contracts import events as ev
from corral.contracts.envelope import CLUSTER_STREAM, Reason, new_event_id
from corral.contracts.registry import encode
from corral.eventstore import ANY, DuplicateEvent, EventStore, NewEvent, StoredEvent
from corral.telemetry import tracing

log = logging.getLogger(__name__)

NodeWork = Callable[[StoredEvent, int], Awaitable[list[Outgoing]]]
"""The node agents' copies of an event (`corral.bus.node_work.NodeWorkRouter.work`), given the
bus's message limit; called for every event in the log's order."""

Fault = Callable[[str, StoredEvent], None]
"""Test hook called at named points of the relay loop; raising there simulates a crash.

Points, per batch read from the log: "before_publish" for each event before the batch is sent,
"after_publish_before_save" for each event once JetStream acknowledged the whole batch, and
"after_save" (with the batch's last event) once the position is saved."""

_RETRY = UnavailableBackoff(first=0.5, cap=5.0)
#: How long a stopping relay tries to save its position (the database may be what stopped it).
_FINAL_SAVE_SECONDS = 2.0
_MESSAGE_TOO_LARGE = 10054  # JetStream error code: message size exceeds the stream's max_msg_size

# Headers that a consumer reads without decoding the payload: where the event stands in its stream
# (a service skips an event it folded already, `Service.on_event`), its log position (where a relay
# resumes, `newest_position_on_bus`; a node agent's fold), and the job it is about (log lines,
# traces). The type is the subject's last token; anything else is in the payload. Each header is
# built by the relay and parsed by every consumer of every event, so there are no others.
STREAM = "Corral-Stream"
STREAM_VERSION = "Corral-Stream-Version"
POSITION = "Corral-Position"
CORRELATION_ID = tracing.CORRELATION  # "Corral-Correlation-Id"


def event_headers(event: StoredEvent) -> dict[str, str]:
    headers = {STREAM: event.stream, STREAM_VERSION: str(event.version), POSITION: str(event.position)}
    if event.correlation_id is not None:
        headers[CORRELATION_ID] = event.correlation_id
    return headers


async def newest_position_on_bus(bus: Bus) -> int | None:
    """The log position (`POSITION` header) of the newest message of the events stream; None when
    the stream is empty (only the relay publishes there: `corral.bus.auth`)."""
    stream = bus.names.stream(EVENTS)
    last = (await bus.js.stream_info(stream)).state.last_seq
    if not last:
        return None
    try:
        message = await bus.js.get_msg(stream, seq=last)
    except nats.js.errors.NotFoundError:  # removed meanwhile (limits): nothing to learn from it
        return None
    value = (message.headers or {}).get(POSITION, "")
    return int(value) if value.isdigit() else None


_BLOCK = len("NATS/1.0\r\n\r\n")
#: Bytes of a header line besides its name and value (`: ` and CRLF).
_LINE = 4


def message_size(message: Outgoing) -> int:
    """Bytes of `message` as NATS counts them against its limits: payload plus the header block
    (`NATS/1.0` line, one `key: value` line each, the msg id included, a blank line).

    Counted in characters when the headers are ASCII (as the relay's are: one `isascii` over them
    all), else in UTF-8 bytes: the relay asks this of every message it publishes."""
    headers = {**(message.headers or {}), MSG_ID: message.msg_id}
    text = "".join(headers) + "".join(headers.values())
    chars = len(text.encode()) if not text.isascii() else len(text)
    return len(message.data) + _BLOCK + chars + _LINE * len(headers)


def not_relayed_alert(event: StoredEvent, size: int, limit: int, why: str) -> ev.EventNotRelayed:
    """The alert for an event the relay skips. Its id is derived from the skipped event's, so a
    relay that crashes after recording it records it only once."""
    rand = hashlib.sha256(event.event_id.encode()).digest()[:10]
    return ev.EventNotRelayed.new(
        stream=CLUSTER_STREAM, actor="relay", correlation_id=event.correlation_id or event.event_id,
        event_id=new_event_id(event.occurred_at, rand), position=event.position,
        event_id_skipped=event.event_id, event_type=event.type, event_stream=event.stream, size=size, limit=limit,
        reason=Reason(code="EVENT_TOO_LARGE", message=f"{event.type} at position {event.position} was not "
                      f"published: {why}; it stays in the log",
                      details={"position": event.position, "bytes": size, "limit": limit}))


def _too_large(exc: BaseException) -> bool:
    """Whether the bus refused a publish for its size (client or server side)."""
    if isinstance(exc, nats.errors.MaxPayloadError):
        return True
    return isinstance(exc, APIError) and (exc.err_code == _MESSAGE_TOO_LARGE
                                          or "maximum" in str(exc.description or "").lower())


#: JetStream stores a message carrying it only right after the message of that id.
EXPECTED_LAST_MSG_ID = "Nats-Expected-Last-Msg-Id"
#: JetStream's answer to a message whose `EXPECTED_LAST_MSG_ID` is not the stream's last message.
_WRONG_LAST_MSG_ID = 10070


def _chain_broken(exc: BaseException) -> bool:
    """Whether the bus refused a chained message because the stream's last message is another."""
    return isinstance(exc, APIError) and exc.err_code == _WRONG_LAST_MSG_ID


def chained(messages: list[Outgoing]) -> list[Outgoing]:
    """`messages`, each after the first carrying the msg id of the one before it as the id the
    stream's last message must have (`EXPECTED_LAST_MSG_ID`).

    Why: a batch is sent pipelined, and while a stream's leader changes JetStream may refuse a
    message ("no responders", 503) and store the next. Republished, the refused one would be
    stored after it: a job's JobAdmitted before its JobSubmitted, and a service that folds only
    newer versions of a stream skips the submission for good (the job waits forever, nothing
    logged). Chained, a message whose predecessor is not the stream's last is refused too (10070);
    a message stored already is answered as a duplicate before its chain is looked at, so
    republishing a batch stays harmless. A refused chain sends the batch one message at a time
    (`OutboxRelay._publish_one_by_one`): a message of another publisher stored between two of the
    batch's (anything a service's identity published by hand) would break the same chain on every
    try of the batch, and one message must never stop the relay."""
    out = messages[:1]
    for before, message in itertools.pairwise(messages):
        out.append(Outgoing(message.subject, message.data, message.msg_id,
                            {**(message.headers or {}), EXPECTED_LAST_MSG_ID: before.msg_id}))
    return out


class OutboxRelay:
    """Publishes the event log to the bus. `start()` runs it as a task; `publish_pending()` does
    one catch-up pass (what `corral up` and tests use to flush deterministically)."""

    def __init__(self, store: EventStore, bus: Bus, subject_for: Callable[[StoredEvent], str],
                 name: str = "relay", *, fault: Fault | None = None, batch: int = 256,
                 linger: float = 0.0, node_work: NodeWork | None = None, save_every: float = 0.0,
                 types: Collection[str] | None = None) -> None:
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        if save_every < 0:
            raise ValueError(f"save_every must be >= 0, got {save_every}")
        self.store = store
        self.bus = bus
        self.subject_for = subject_for
        self.name = name
        self._fault = fault
        self._batch = batch
        #: the wait after a partial batch, taken while appends come often enough (`corral.bus.pacing`)
        self._linger = Linger(linger)
        self._task: asyncio.Task[None] | None = None
        #: what each node agent is sent of an event, before the event itself (`corral.bus.node_work`)
        self.node_work = node_work
        self._save_every = save_every
        #: the event types published on their own subject (None: every type); the others stay in
        #: the log alone, and only their node work (if any) is sent
        self.types = frozenset(types) if types is not None else None
        #: the last event `run` saw acknowledged and has not saved the position of yet
        self._unsaved: StoredEvent | None = None
        self._saving: asyncio.Task[None] | None = None
        #: whether the next batch is acknowledged by its last message alone (`_publish_chained`):
        #: after a batch this relay saw stored with no duplicate in it
        self._acked_by_last = False

    async def resume_position(self) -> int:
        """Where to publish from: the saved position, or the position of the newest event the bus
        still holds when that is older (the bus lost its tail, see the module docstring)."""
        saved = await self.store.relay_position(self.name)
        held = await newest_position_on_bus(self.bus)
        if held is not None and held < saved:
            held = await self._unpublished_through(held, saved)
        if held is not None and held < saved:
            log.warning("relay %s: the bus holds the log only up to position %d, %d were published: "
                        "publishing again from there (a crash of its machine lost the rest)",
                        self.name, held, saved)
            return held
        return saved

    async def _unpublished_through(self, after: int, until: int) -> int:
        """The position up to which the log after `after` holds only events this relay does not
        publish (`types`), at most `until`: the bus's newest message is older than the saved
        position also when the log's tail is such events, and nothing of that tail was lost."""
        if self.types is None:
            return after
        while after < until:
            events = await self.store.read_all(after, limit=self._batch)
            for event in events:
                if event.position > until or event.type in self.types:
                    return after
                after = event.position
            if not events:
                break
        return min(after, until)

    async def publish_pending(self) -> int:
        """Publish everything appended so far that this relay has not published; return how many."""
        after = await self.resume_position()
        published = 0
        while True:
            events = await self.store.read_all(after, limit=self._batch)
            if not events:
                return published
            after = await self._publish_batch(events)
            published += len(events)

    async def run(self) -> None:
        """Relay forever: catch up from the saved position, then follow new appends. Bus or
        database outages (`is_unavailable`) are waited out; anything else (a bug, or a fault hook)
        ends the run."""
        failures = 0
        try:
            while True:
                try:
                    await self._follow()
                    failures = 0
                except Exception as exc:
                    if not is_unavailable(exc):
                        raise
                    failures += 1
                    delay = _RETRY.delay(failures)
                    log.warning("relay %s: %s: %s; retrying in %.1fs", self.name, type(exc).__name__, exc, delay)
                    await asyncio.sleep(delay)
        finally:
            await self._stop_saving()

    async def _follow(self) -> None:
        """Publish from where the bus and the saved position say, following new appends."""
        await self._save_unsaved()  # resume from what was acknowledged, not from an older save
        after = await self.resume_position()
        batches = self.store.follow_batches(after, limit=self._batch)
        async with contextlib.aclosing(batches):
            async for events in batches:
                await self._publish_batch(events, save=self._save_every <= 0)
                if self._save_every > 0:
                    self._save_later(events[-1])
                linger = self._linger.after(len(events))
                if linger > 0 and len(events) < self._batch:
                    # Keeping up with a stream of appends: let a few gather so one publish round
                    # trip covers them all. On a quiet log nothing would gather: no wait.
                    await asyncio.sleep(linger)

    def _save_later(self, last: StoredEvent) -> None:
        """Save `last`'s position within `save_every` seconds (with any later batch's instead)."""
        self._unsaved = last
        if self._saving is None or self._saving.done():
            self._saving = asyncio.create_task(self._save_after_a_while(), name=f"relay:{self.name}:save")

    async def _save_after_a_while(self) -> None:
        """Save until nothing acknowledged is unsaved: a batch acknowledged during a save is saved
        by the next turn (it may be the last batch for a long while)."""
        while self._unsaved is not None:
            await asyncio.sleep(self._save_every)
            try:
                await self._save_unsaved()
            except Exception as exc:  # kept for the next save; the relay's own reads meet the outage
                log.warning("relay %s: the position was not saved: %s: %s", self.name, type(exc).__name__, exc)
                return

    async def _save_unsaved(self) -> None:
        last = self._unsaved
        if last is None:
            return
        await self.store.save_relay_position(self.name, last.position)
        if self._unsaved is last:
            self._unsaved = None
        self._hook("after_save", last)

    async def _stop_saving(self) -> None:
        """Stop the pending save and make it now, when the database lets it (a relay that stops
        leaves its position saved: the next one publishes nothing twice)."""
        saving, self._saving = self._saving, None
        if saving is not None and not saving.done():
            saving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await saving
        try:
            await asyncio.wait_for(self._save_unsaved(), _FINAL_SAVE_SECONDS)
        except Exception as exc:  # what the next relay publishes again is dropped as a duplicate
            log.warning("relay %s: the position was not saved on stopping: %s: %s", self.name,
                        type(exc).__name__, exc)

    def start(self) -> asyncio.Task[None]:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name=f"relay:{self.name}")
        return self._task

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _publish_batch(self, events: list[StoredEvent], *, save: bool = True) -> int:
        limit = self.bus.max_message_bytes
        messages: list[Outgoing] = []
        publishable: list[tuple[StoredEvent, bool]] = []  # (event, whether the message is the event itself)
        for event in events:
            self._hook("before_publish", event)
            copies = await self.node_work(event, limit) if self.node_work is not None else []
            if not copies and self.types is not None and event.type not in self.types:
                continue  # no process is sent it: the log holds it
            subject = self.subject_for(event)
            headers = event_headers(event)
            traceparent = tracing.relayed(event.trace_context, event.type, subject, event.position)
            if traceparent is not None:
                headers[tracing.TRACEPARENT] = traceparent
            # Each node's copy goes first: the batch's last message is always an event itself,
            # whose position `newest_position_on_bus` reads. A copy is a child of the event's
            # relay span, as the event is (not of whatever this process saw of the job last).
            for copy in copies:
                if traceparent is not None:
                    copy = replace(copy, headers={**(copy.headers or {}), tracing.TRACEPARENT: traceparent})
                if message_size(copy) <= limit:
                    messages.append(copy)
                    publishable.append((event, False))
            message = Outgoing(subject, event.data, event.event_id, headers)
            size = message_size(message)
            if size > limit:
                await self._skip(event, size, limit, f"{size:,} bytes with headers; the bus takes at most "
                                                     f"{limit:,} (CORRAL_MAX_EVENT_BYTES / NATS max_payload)")
                continue
            messages.append(message)
            publishable.append((event, True))
        if messages:
            try:
                await self._publish_chained(chained(messages))
            except Exception as exc:
                if not (_too_large(exc) or _chain_broken(exc)):
                    raise
                # One at a time, each stored before the next leaves: in order without a chain, also
                # when another publisher stored a message between two of ours.
                await self._publish_one_by_one(publishable, messages, limit)
        for event in events:
            self._hook("after_publish_before_save", event)
        last = events[-1]
        if save:
            await self.store.save_relay_position(self.name, last.position)
            self._hook("after_save", last)
        return last.position

    async def _publish_chained(self, messages: list[Outgoing]) -> None:
        """Publish a chained batch, acknowledged by its last message while the bus stores this
        relay's messages as sent; else (and after any doubt) each message acknowledged.

        The last message's acknowledgement (stored, not a duplicate) says the whole batch was
        stored in order: JetStream stored it right after the batch's message before it (the chain),
        and that one was stored, so every message this relay sent before it was: each batch leaves
        only after the one before it was acknowledged, whatever relay sent it. A refused message
        (no reply to say so) breaks the chain of every later one, the last's included. A duplicate
        says another relay, or an earlier try of this one, stored it: which of the batch it stored
        is not known, so the batch goes again with each message acknowledged, and so does every
        batch until one is stored with no duplicate in it (a relay that resumes, or meets another)."""
        if self._acked_by_last and len(messages) > 1:
            try:
                last = await self.bus.publish_acked_by_last(messages)
            except Exception as exc:  # sent again below, each acknowledged: that one says what failed
                log.info("relay %s: a batch acknowledged by its last message failed (%s: %s); sending it "
                         "again, each message acknowledged", self.name, type(exc).__name__, exc)
            else:
                if not last.duplicate:
                    return
            self._acked_by_last = False
        acks = await self.bus.publish_many(messages)
        self._acked_by_last = not any(ack.duplicate for ack in acks)

    async def _publish_one_by_one(self, events: list[tuple[StoredEvent, bool]], messages: list[Outgoing],
                                  limit: int) -> None:
        """The bus refused the batch for a message's size (a limit this relay did not know) or its
        chain: each message stored before the next leaves; one refused for its size is skipped with
        an alert (a node's copy: with an error line)."""
        for (event, itself), message in zip(events, messages, strict=True):
            try:
                await self.bus.publish_many([message])
            except Exception as exc:
                if not _too_large(exc):
                    raise
                if itself:
                    await self._skip(event, message_size(message), limit, f"the bus refused it: {exc}")
                else:
                    log.error("relay %s: %s of %s not sent to %s: the bus refused it: %s", self.name,
                              event.type, event.stream, message.subject, exc)

    async def _skip(self, event: StoredEvent, size: int, limit: int, why: str) -> None:
        """Record in the log that `event` is not on the bus, then move on: one event must never
        stop the relay (it stays in the log; a consumer that misses it finds it there)."""
        log.error("relay %s: event %s (%s, position %d) not relayed: %s", self.name, event.event_id, event.type,
                  event.position, why)
        alert = not_relayed_alert(event, size, limit, why)
        with contextlib.suppress(DuplicateEvent):  # recorded before a crash: once is enough
            await self.store.append(CLUSTER_STREAM, ANY, [NewEvent(
                event_id=alert.event_id, stream=alert.stream, type=alert.type, schema_version=alert.schema_version,
                data=encode(alert), correlation_id=alert.correlation_id, causation_id=alert.causation_id,
                occurred_at=alert.occurred_at)])

    def _hook(self, point: str, event: StoredEvent) -> None:
        if self._fault is not None:
            self._fault(point, event)
