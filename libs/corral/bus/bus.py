"""The JetStream bus: streams declared in code, deduplicated publishing, durable pull consumers.

Why JetStream's `Nats-Msg-Id`: every publish carries the event's id, and the stream drops a second
message with the same id within its duplicate window. A publisher that retries after a lost ack,
or an outbox relay that restarts and republishes, therefore causes no second delivery.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import msgspec
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import APIError, BadRequestError, NoStreamResponseError, NotFoundError

from corral import environment
from corral.bus.client import Client, connect
from corral.bus.consumer import BatchHandler, RunningConsumer, dead_letter_publisher
from corral.bus.delivery import MSG_ID, Handler
from corral.bus.limits import BusLimits
from corral.bus.naming import DLQ, EVENTS, INBOX, LOGS, Namespace
from corral.bus.options import CA_ENV, identity_options, tls_context
from corral.bus.unavailable import UnavailableBackoff, is_unavailable
from corral.bus.urls import first_credentials, server_urls
from corral.contracts.subjects import ADMIN_REQUEST_TYPES, INBOX_TYPES, NODE_REPORT_TYPES, USER_REQUEST_TYPES
from corral.telemetry import tracing

_log = logging.getLogger("corral.bus")
DUPLICATE_WINDOW = 120.0  # seconds; a republish later than this is a new message to JetStream
_NO_RESPONDERS = "503"  # status header NATS sends to the reply subject when no stream took a publish
_STREAM_IN_USE = 10058  # JetStream error code: stream name already in use with another config
_CLUSTER_REPLICAS = 3  # replicas of a new stream when the URL lists this many servers or more
_NO_SUITABLE_PEERS = 10005  # JetStream error code: not enough servers for the replicas asked for


class _PubAckReply(msgspec.Struct):
    """A JetStream publish acknowledgement as the server sends it (other fields ignored).

    nats-py reads one with `json.loads` and `PubAck.from_response`, a walk over the dataclass's
    fields per message (~10 us of the relay's CPU per event, `bench/bus.py`); msgspec reads only
    these fields, in C."""

    stream: str | None = None
    seq: int | None = None
    duplicate: bool | None = None
    error: dict[str, Any] | None = None


_PUB_ACK = msgspec.json.Decoder(_PubAckReply)


def pub_ack(data: bytes) -> _PubAckReply | APIError:
    """A publish acknowledgement (`stream`, `seq`, `duplicate`), or the JetStream error it carries;
    ValueError if it is neither (what nats-py's PubAck refuses: no stream or no sequence)."""
    reply = _PUB_ACK.decode(data)
    if reply.error is not None:
        return _api_error(reply.error)
    if reply.stream is None or reply.seq is None:
        raise ValueError(f"not a publish acknowledgement: {data[:200]!r}")
    return reply


def _api_error(error: dict[str, Any]) -> APIError:
    """The JetStream error for an error response. (`APIError.from_error` raises it instead of
    returning it: set as a future's result that raise escaped the ack callback, and the publish
    waited for its timeout instead of failing, e.g. a message over the stream's size limit.)"""
    try:
        return APIError.from_error(error)
    except APIError as exc:
        return exc
class NatsCertificateError(ssl.SSLCertVerificationError):
    """The nats-server's certificate does not verify against the CA given (a wrong CA file, a
    certificate for another host, or an impostor): retrying cannot help, so connecting stops."""


async def _connect(url: str, listeners: Sequence[Callable[[Exception], None]] = (), **options: Any) -> Any:
    """`nats.connect`, which retries forever (`max_reconnect_attempts=-1`: a NATS not up yet is an
    unavailable dependency, not an error), except when the server's certificate fails verification:
    that is a configuration error and is raised at once, naming the URL and what to check.

    `url` may list several servers separated by commas (a JetStream cluster, see `corral.bus.urls`):
    the client connects to one and, when that one is lost, reconnects to another."""
    servers = server_urls(url)
    failed: asyncio.Future[ssl.SSLCertVerificationError] = asyncio.get_running_loop().create_future()

    async def on_error(exc: Exception) -> None:
        if isinstance(exc, ssl.SSLCertVerificationError) and not failed.done():
            failed.set_result(exc)
        _log.warning("nats: %s: %s", type(exc).__name__, exc)
        for listener in list(listeners):
            listener(exc)

    connecting: asyncio.Future[Any] = asyncio.ensure_future(connect(servers, error_cb=on_error, **options))
    waiting: set[asyncio.Future[Any]] = {connecting, failed}
    try:
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    finally:  # cancelled (a process told to stop while it waits for NATS): no connection left trying
        if not connecting.done():
            connecting.cancel()
            await asyncio.gather(connecting, return_exceptions=True)
    if not connecting.cancelled():
        return connecting.result()
    cause = failed.result()
    where = urlsplit(servers[0])
    raise NatsCertificateError(
        cause.verify_code,
        f"the NATS server at {where.hostname}:{where.port} did not prove it is the one this CA "
        f"certified ({cause.verify_message}): check CORRAL_NATS_CA / the context's `nats_ca` names the "
        "`tls/ca.pem` of the `corral up` that runs this server") from cause


def _cluster_forming(exc: BaseException) -> bool:
    """JetStream's 10005 "no suitable peers for placement": fewer servers known than the replicas
    asked for, as while a cluster's servers still find each other (a start beside it), or for
    good when it has fewer servers (then the wait for the streams ends with this error)."""
    return isinstance(exc, APIError) and exc.err_code == _NO_SUITABLE_PEERS


#: Roles whose identity may only read stream info (see `corral.bus.auth`): they wait for the streams.
_STREAM_READERS = ("agent", "submitter", "gateway", "admin")
_STREAMS_WAIT = 60.0
#: How long creating a consumer waits out an unavailable JetStream (see `Bus._create_consumer`).
_CONSUMER_WAIT = 120.0


def _service_name(connection: str) -> str:
    """The name a process's spans carry: its NATS connection's (a service's name, `corral-cli`),
    one name for every node-agent process (`corral-node-agents-<ns>`: `node-agent`)."""
    return "node-agent" if connection.startswith("corral-node-agents") else connection


_READABLE_KEPT = 4096


def _matches(subject: str, pattern: str) -> bool:
    """Whether a concrete subject matches a NATS subject pattern with `*` tokens (no `>`)."""
    tokens, wanted = subject.split("."), pattern.split(".")
    return len(tokens) == len(wanted) and all(w in ("*", t) for t, w in zip(tokens, wanted, strict=True))


class StreamMissing(NoStreamResponseError):
    """No JetStream stream takes the subject: the streams were not declared on this server yet."""

    def __init__(self, subject: str) -> None:
        super().__init__(subject)
        self.subject = subject

    def __str__(self) -> str:
        return (f"no JetStream stream takes {self.subject!r}: declare the streams first with "
                "`await bus.ensure_streams()` (idempotent; every service and client may call it)")


@dataclass(frozen=True, slots=True)
class Published:
    """JetStream's acknowledgement: where the message landed, and whether it was a duplicate."""

    stream: str
    sequence: int
    duplicate: bool


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message for `Bus.publish_many`."""

    subject: str
    data: bytes
    msg_id: str
    headers: Mapping[str, str] | None = None


class Bus:
    """A connection to NATS JetStream scoped to one namespace. Open with `await Bus.connect(url)`."""

    def __init__(self, nc: Any, namespace: Namespace, limits: BusLimits | None = None) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.names = namespace
        self.limits = limits or BusLimits.from_env()
        self._consumers: list[RunningConsumer] = []
        self._ack_prefix: str | None = None
        self._acks: dict[str, asyncio.Future[Any]] = {}
        self._ack_seq = 0
        #: False for identities that may not create streams: `ensure_streams` waits for them instead.
        self.manages_streams = True
        #: Called with each error the connection reports asynchronously (a permissions violation,
        #: a lost server), after it is logged; add and remove freely (`Bus.connect`'s bus only).
        self.error_listeners: list[Callable[[Exception], None]] = []
        #: Replicas of a stream this bus creates without a replicas setting (`BusLimits`): three
        #: when its URL lists a cluster (`Bus.connect`), else one.
        self.new_stream_replicas = 1
        #: Inbox subjects `_check_subject` found read (a node agent publishes its few, per rank
        #: start and exit: matched against every inbox pattern each time, 7% of the agents' CPU).
        self._readable_inbox: set[str] = set()

    @classmethod
    async def connect(cls, url: str, namespace: str = "corral", *, name: str | None = None,
                      limits: BusLimits | None = None, credentials: str | None = None,
                      ca: str | None = None) -> Bus:
        """`credentials`: a credentials file written by `corral up` (see `corral.stack.credentials`);
        default: the file named by `$CORRAL_NATS_CREDENTIALS`, if set. `ca`: the CA file the server's
        certificate must chain to (TLS, see `corral.stack.tls`); default: `$CORRAL_NATS_CA`, if set."""
        names = Namespace(namespace)
        identity = identity_options(credentials or environment.get("CORRAL_NATS_CREDENTIALS"))
        url_user, url_password = first_credentials(url)
        if not identity and url_user:
            # nats://user:password@host: replies only on the user's inbox. The user and password
            # are given as options too: a server of the cluster learned from another (not in the
            # URL) is connected to with them, not refused as anonymous.
            identity = {"inbox_prefix": f"_INBOX.{url_user}", "user": url_user, "password": url_password}
        role = identity.pop("role", None)
        tls = tls_context(ca or environment.get(CA_ENV))
        if tls is not None:
            _quiet_ssl_eof_notice()
            # TLS before anything else (the server's `handshake_first`): an impostor on the address
            # that does not hold a certificate of this CA never receives the password.
            identity.update(tls=tls, tls_handshake_first=True)
        listeners: list[Callable[[Exception], None]] = []
        nc = await _connect(url, listeners, name=name or f"corral-{namespace}", max_reconnect_attempts=-1,
                            **identity)
        tracing.configure(_service_name(name or f"corral-{namespace}"))
        bus = cls(nc, names, limits)
        bus.error_listeners = listeners
        bus.manages_streams = role not in _STREAM_READERS
        if len(server_urls(url)) >= _CLUSTER_REPLICAS:
            bus.new_stream_replicas = _CLUSTER_REPLICAS
        return bus

    @property
    def max_message_bytes(self) -> int:
        """The largest event message (payload and headers) the bus takes: the stream limit, or
        the server's max payload if that is smaller."""
        server = int(getattr(self.nc, "max_payload", 0) or 0)
        return min(self.limits.max_event_bytes, server) if server > 0 else self.limits.max_event_bytes

    def inbox_subjects(self) -> list[str]:
        """The inbox subjects some Corral service reads: the only ones the inbox stream takes
        (the bare `<ns>.inbox.<Type>`, which only a superuser may publish to, and the ones that name
        their sender: `<ns>.inbox.node.<node>.<Report>`, `<ns>.inbox.user.<user>.<Request>` and
        `<ns>.inbox.admin.<admin>.<Request>`)."""
        return ([self.names.inbox_subject(t) for t in INBOX_TYPES]
                + [f"{self.names.name}.inbox.node.*.{t}" for t in NODE_REPORT_TYPES]
                + [f"{self.names.name}.inbox.user.*.{t}" for t in USER_REQUEST_TYPES]
                + [f"{self.names.name}.inbox.admin.*.{t}" for t in ADMIN_REQUEST_TYPES])

    @property
    def namespace(self) -> str:
        return self.names.name

    async def close(self) -> None:
        """Stop this bus's consumers, flush pending publishes and disconnect."""
        for consumer in list(self._consumers):
            await consumer.stop()
        self._consumers.clear()
        with contextlib.suppress(Exception):
            await self.nc.drain()
        if not self.nc.is_closed:
            await self.nc.close()

    async def __aenter__(self) -> Bus:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # -- streams --------------------------------------------------------------------------------

    def stream_configs(self) -> list[StreamConfig]:
        """The four streams: events (the facts), inbox (requests to services), dlq (failures),
        logs (ranks' output, user data: `corral.contracts.logs`).

        Each is bounded (`BusLimits`: age, bytes, message size; oldest discarded first). The inbox
        takes only the subjects a service reads (`INBOX_TYPES`): a request on any other subject
        is refused at publish (the publisher hears "no responders" at once) instead of being
        stored where no one ever reads it. The dead-letter stream keeps one entry per original
        message (subject `<ns>.dlq.<STREAM>.<seq>`, at most one message per subject), however many
        consumers gave up on it."""
        limits = self.limits
        common: dict[str, Any] = {"retention": RetentionPolicy.LIMITS, "storage": StorageType.FILE,
                                  "discard": DiscardPolicy.OLD, "duplicate_window": DUPLICATE_WINDOW,
                                  "num_replicas": limits.stream_replicas}
        return [
            StreamConfig(name=self.names.stream(EVENTS), subjects=[self.names.wildcard(EVENTS)],
                         max_age=limits.events_max_age, max_bytes=limits.events_max_bytes,
                         max_msg_size=limits.max_event_bytes, max_consumers=limits.events_max_consumers,
                         description="Corral events, published by the outbox relay from the event store",
                         **common),
            StreamConfig(name=self.names.stream(INBOX), subjects=self.inbox_subjects(),
                         max_age=limits.inbox_max_age, max_bytes=limits.inbox_max_bytes,
                         max_msg_size=limits.max_event_bytes,
                         description="Requests addressed to Corral services", **common),
            StreamConfig(name=self.names.stream(DLQ), subjects=[self.names.wildcard(DLQ)],
                         max_age=limits.dlq_max_age, max_bytes=limits.dlq_max_bytes,
                         max_msgs=limits.dlq_max_msgs, max_msgs_per_subject=1,
                         max_msg_size=limits.dlq_max_msg_bytes,
                         description="Messages a consumer could never process, with the reason in headers; "
                                     "one per original message", **common),
            StreamConfig(name=self.names.stream(LOGS), subjects=[self.names.wildcard(LOGS)],
                         max_age=limits.logs_max_age, max_bytes=limits.logs_max_bytes,
                         max_msg_size=limits.logs_max_msg_bytes,
                         description="Ranks' output published by node agents (user data, not events; "
                                     "the full files stay on the nodes)", **common),
        ]

    async def ensure_streams(self) -> None:
        """Create the streams, or bring an existing one to the declared config. Idempotent.

        A stream already as declared is left alone without a create call, so clients whose identity
        may only read stream info (node agents, submitters: see `corral.bus.auth`) pass here; they
        wait for every stream but the log stream, which only delays their log chunks.
        Without a replicas setting (`BusLimits.stream_replicas` None) a stream is created with
        `new_stream_replicas` (three when the URL lists a cluster's servers, else one) and an
        existing stream keeps its replicas, also when another limit is updated.

        An unavailable JetStream (`is_unavailable`: a timeout, a 503 "insufficient resources" while
        a cluster still forms or elects; or "no suitable peers" while its servers still find each
        other) is waited out for up to `_STREAMS_WAIT` seconds per stream:
        a service started beside a NATS cluster that was not ready crashed here (CI, the 3-server
        test: `update_stream` timed out) instead of waiting for its dependency."""
        loop = asyncio.get_running_loop()
        for config in self.stream_configs():
            deadline = loop.time() + _STREAMS_WAIT
            attempt = 0
            while True:
                try:
                    await self._declare_stream(config)
                    break
                except Exception as exc:
                    if not (is_unavailable(exc) or _cluster_forming(exc)) or loop.time() > deadline:
                        raise
                    attempt += 1
                    delay = UnavailableBackoff().delay(attempt)
                    _log.warning("stream %s: JetStream unavailable (%s: %s); retrying in %.1fs",
                                 config.name, type(exc).__name__, exc, delay)
                    await asyncio.sleep(delay)

    async def _declare_stream(self, config: StreamConfig) -> None:
        if await self._stream_as_declared(config):
            return
        if not self.manages_streams:
            if config.name == self.names.stream(LOGS):
                # Not needed to run: an agent's log chunks wait for it (services of an older
                # version never create it, and an agent upgraded first must still start).
                return
            await self._wait_for_stream(config)
            return
        try:
            # A stream made with one replica in a cluster (by a client run before the services)
            # and raised to three when the services declare theirs is remapped to a new group: a
            # server lost before the new replicas catch up can leave it without a leader for minutes.
            await self.js.add_stream(config if config.num_replicas is not None
                                     else dataclasses.replace(config, num_replicas=self.new_stream_replicas))
        except BadRequestError as exc:
            if exc.err_code != _STREAM_IN_USE:
                raise
            if config.num_replicas is None:
                existing = await self.js.stream_info(config.name)
                config.num_replicas = existing.config.num_replicas
            await self.js.update_stream(config)

    async def _wait_for_stream(self, config: StreamConfig) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _STREAMS_WAIT
        said = False
        while not await self._stream_as_declared(config):
            if not said:
                said = True
                _log.info("stream %s: not there as declared yet; waiting up to %.0fs for the services to "
                          "declare it", config.name, _STREAMS_WAIT)
            if loop.time() > deadline:
                raise StreamMissing(config.subjects[0] if config.subjects else config.name or "?")
            await asyncio.sleep(0.2)

    async def _stream_as_declared(self, config: StreamConfig) -> bool:
        try:
            existing = (await self.js.stream_info(config.name)).config.as_dict()
        except (NotFoundError, APIError, TimeoutError):
            return False
        declared = config.as_dict()
        # A client that cannot manage streams (an agent) takes the consumer limit its services set:
        # an agent upgraded before them must still start.
        ignored = () if self.manages_streams else ("max_consumers",)
        return all(existing.get(key) == value for key, value in declared.items()
                   if value is not None and key not in ignored)

    # -- publishing -----------------------------------------------------------------------------

    async def publish(self, subject: str, data: bytes, msg_id: str,
                      headers: Mapping[str, str] | None = None, *, timeout: float = 5.0,
                      retry_for: float = 0.0) -> Published:
        """Publish to JetStream and wait for its ack. A second publish with the same `msg_id`
        within the duplicate window is acknowledged with `duplicate=True` and not stored again.

        `retry_for` > 0: while JetStream is unavailable (`is_unavailable`: a timeout, no leader
        for the stream yet, the connection moving to another server of the cluster), publish again
        with the same `msg_id` until that many seconds have passed. For a person's request (a
        submission): a NATS server lost mid-request is waited out, never a failed submit, and a
        retry after a lost ack stores nothing twice."""
        if not msg_id:
            raise ValueError("msg_id must be a non-empty string (the event_id): it deduplicates retries")
        self._check_subject(subject)
        all_headers = {**(tracing.outgoing(subject, headers) or {}), MSG_ID: msg_id}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + retry_for
        attempt = 0
        while True:
            try:
                ack = await self.js.publish(subject, data, timeout=timeout, headers=all_headers)
                break
            except Exception as exc:
                if retry_for <= 0 or not is_unavailable(exc) or loop.time() >= deadline:
                    if isinstance(exc, NoStreamResponseError):
                        raise StreamMissing(subject) from exc
                    raise
                attempt += 1
                delay = min(UnavailableBackoff(first=0.25, cap=2.0).delay(attempt), max(0.0, deadline - loop.time()))
                _log.warning("publish to %s: %s (%s); retrying in %.1fs", subject, type(exc).__name__, exc, delay)
                await asyncio.sleep(delay)
        return Published(stream=ack.stream, sequence=int(ack.seq), duplicate=bool(ack.duplicate))

    async def publish_many(self, messages: Sequence[Outgoing], *, timeout: float = 10.0) -> list[Published]:
        """Publish several messages pipelined (sent in order, then all acks awaited): one round trip
        instead of one per message. They are stored in the given order. If any fails, this raises
        and the caller should republish the lot; the msg ids make that harmless.

        Why not nats-py's `publish_async`: it awaits a semaphore through `asyncio.wait_for`, which
        yields to the event loop after every message, so each one went out in a socket write of
        its own (a fifth of the relay's CPU). Here all messages are queued without yielding and
        leave in one write; the acks come back on one reply subscription of this bus."""
        return await self._publish_pipelined(messages, timeout, last_only=False)

    async def publish_acked_by_last(self, messages: Sequence[Outgoing], *, timeout: float = 10.0) -> Published:
        """Publish `messages` as `publish_many` does, but only the last one asks JetStream for an
        acknowledgement: the others carry no reply subject, and one refused says nothing. Returns
        the last one's.

        For chained messages (`corral.bus.relay.chained`), whose last one JetStream stores only
        right after the one before it: its acknowledgement, not a duplicate's, says every message
        was stored, in order. A publisher pays per acknowledgement (JetStream's reply, and the
        client's parse and wake-up of the waiting publish); the relay's batches hold tens of
        messages."""
        if not messages:
            raise ValueError("publish_acked_by_last needs at least one message")
        (last,) = await self._publish_pipelined(messages, timeout, last_only=True)
        return last

    async def _publish_pipelined(self, messages: Sequence[Outgoing], timeout: float, *,
                                 last_only: bool) -> list[Published]:
        """The acks of `messages` (of the last one alone with `last_only`), all sent in one write."""
        prefix = await self._ack_inbox()
        loop = asyncio.get_running_loop()
        tokens: list[str] = []
        futures: list[asyncio.Future[Any]] = []
        batch = isinstance(self.nc, Client)  # all frames in one command (`Client.publish_batch`)
        frames: list[tuple[str, str, bytes, dict[str, Any]]] = []
        final = len(messages) - 1
        try:
            for index, message in enumerate(messages):
                if not message.msg_id:
                    raise ValueError("msg_id must be a non-empty string (the event_id)")
                self._check_subject(message.subject)
                headers = {**(tracing.outgoing(message.subject, message.headers) or {}), MSG_ID: message.msg_id}
                reply = ""
                if not last_only or index == final:
                    self._ack_seq += 1
                    token = str(self._ack_seq)
                    future: asyncio.Future[Any] = loop.create_future()
                    self._acks[token] = future
                    tokens.append(token)
                    futures.append(future)
                    reply = f"{prefix}.{token}"
                if batch:
                    frames.append((message.subject, reply, message.data, headers))
                else:
                    await self.nc.publish(message.subject, message.data, reply=reply, headers=headers)
            if frames:
                await self.nc.publish_batch(frames)
            acks = await asyncio.wait_for(asyncio.gather(*futures), timeout)
        except NoStreamResponseError as exc:
            answered = messages[-1:] if last_only else messages
            failed = next((m.subject for m, f in zip(answered, futures, strict=False)
                           if f.done() and not f.cancelled() and f.exception() is not None),
                          messages[0].subject)
            raise StreamMissing(failed) from exc
        finally:
            for token in tokens:
                self._acks.pop(token, None)
            for future in futures:
                future.cancel()
        return [Published(stream=ack.stream, sequence=int(ack.seq), duplicate=bool(ack.duplicate))
                for ack in acks]

    def _check_subject(self, subject: str) -> None:
        """Refuse subjects that would go nowhere: outside our namespace, or an inbox no one reads."""
        # the inbox list is built only for an inbox subject: built for every event the relay
        # published, it was a tenth of the relaying process's time (py-spy, Kueue shape)
        if subject in self._readable_inbox or self.names.kind_of(subject) != INBOX:
            return
        if not any(_matches(subject, k) for k in self.inbox_subjects()):
            raise ValueError(f"no Corral service reads {subject!r}: the inbox subjects are "
                             f"{', '.join(self.inbox_subjects())}")
        if len(self._readable_inbox) >= _READABLE_KEPT:  # one per node (or user) and type: bounded anyway
            self._readable_inbox.clear()
        self._readable_inbox.add(subject)

    async def _ack_inbox(self) -> str:
        if self._ack_prefix is None:
            prefix = self.nc.new_inbox()
            if isinstance(self.nc, Client):  # each ack handed over from the read loop
                await self.nc.subscribe_direct(f"{prefix}.*", self._acknowledged)
            else:
                await self.nc.subscribe(f"{prefix}.*", cb=self._on_ack)
            self._ack_prefix = prefix
        return self._ack_prefix

    async def _on_ack(self, msg: Any) -> None:
        await self._acknowledged(msg.subject, msg.data, msg.headers)

    async def _acknowledged(self, subject: str, data: bytes, headers: Mapping[str, str] | None) -> None:
        """A publish acknowledgement (or its error) for the publish waiting on its reply subject."""
        future = self._acks.pop(subject.rsplit(".", 1)[-1], None)
        if future is None or future.done():
            return
        if headers and headers.get("Status") == _NO_RESPONDERS:
            future.set_exception(NoStreamResponseError())
            return
        try:
            ack = pub_ack(data)
        except (ValueError, TypeError, KeyError) as exc:  # msgspec's errors are ValueErrors
            future.set_exception(exc)
            return
        if isinstance(ack, APIError):
            future.set_exception(ack)
        else:
            future.set_result(ack)

    # -- consuming ------------------------------------------------------------------------------

    async def consume(self, durable: str, subjects: Sequence[str], handler: Handler, *,
                      max_deliver: int = 5, backoff: Sequence[float] = (0.5, 2.0, 10.0, 30.0),
                      batch: int = 16, ack_wait: float = 30.0,
                      deliver_new_only: bool = False, linger: float = 0.0, paced: bool = True,
                      batch_handler: BatchHandler | None = None,
                      inactive_threshold: float | None = None,
                      unavailable_backoff: UnavailableBackoff | None = None) -> RunningConsumer:
        """Start a durable pull consumer on `subjects` (all in one stream) and return it running.

        The durable is created (or updated) before this returns, so anything published afterwards
        reaches it. See `corral.bus.consumer` for how results are acknowledged, retried and
        dead-lettered. `linger` > 0: after a fetch that did not fill `batch`, wait that many
        seconds before the next one (fewer, larger batches at the cost of that much latency);
        `paced`: only while messages come often enough for the wait to gather some
        (`corral.bus.pacing`), else after every partial batch.
        `batch_handler`, if given, is called with each fetched batch instead of `handler` per
        message (see `BatchHandler`). `ack_wait` is how long a crashed consumer holds a message
        before the server redelivers it. `inactive_threshold` (seconds): the server deletes the
        durable after that long without a consumer (for durables named after something that may
        go away for good, such as a node set). `unavailable_backoff`: the delays between tries
        while a dependency is down. Stop with `await consumer.stop()` (or `bus.close()`).
        """
        if max_deliver < 1:
            raise ValueError(f"max_deliver must be >= 1, got {max_deliver}")
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        if any(delay < 0 for delay in backoff):
            raise ValueError(f"backoff delays must be >= 0 seconds, got {list(backoff)}")
        stream = self.names.stream_for(subjects)
        config = ConsumerConfig(
            # named: the create call's subject then names the consumer and its one filter, which an
            # identity's permissions can allow exactly (`corral.bus.auth.agent`)
            name=durable,
            durable_name=durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.NEW if deliver_new_only else DeliverPolicy.ALL,
            ack_wait=ack_wait,
            max_deliver=-1,  # the limit is kept by the consumer, never silently: see corral.bus.consumer
            max_ack_pending=max(1000, batch * 4),
            inactive_threshold=inactive_threshold,
        )
        if len(subjects) == 1:
            config.filter_subject = subjects[0]
        else:
            config.filter_subjects = list(subjects)
        subscription = await self._create_consumer(stream, config, unavailable_backoff or UnavailableBackoff())
        consumer = RunningConsumer(
            subscription, durable, handler,
            dead_letter_publisher(self.publish, self.names.dead_letter_subject, durable),
            max_deliver=max_deliver, backoff=backoff, batch=batch, linger=linger, paced=paced,
            batch_handler=batch_handler,
            unavailable_backoff=unavailable_backoff,
        )
        self._consumers.append(consumer)
        consumer.task.add_done_callback(lambda _: self._forget(consumer))
        return consumer

    async def _create_consumer(self, stream: str, config: ConsumerConfig, backoff: UnavailableBackoff) -> Any:
        """Create (or update) the durable and bind a pull subscription to it, waiting out an
        unavailable JetStream (`is_unavailable`) with `backoff` for up to `_CONSUMER_WAIT` seconds.

        In a JetStream cluster a consumer create answers 503 ("insufficient resources", "JetStream
        system temporarily unavailable") while the servers still elect the stream's leader: right
        after the streams are created, and after a server is lost. That is a dependency to wait
        for, not a reason for a starting service to crash."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _CONSUMER_WAIT
        attempt = 0
        while True:
            try:
                await self.js.add_consumer(stream, config)
                return await self.js.pull_subscribe_bind(durable=config.durable_name, stream=stream)
            except Exception as exc:
                if not is_unavailable(exc) or loop.time() > deadline:
                    raise
                attempt += 1
                delay = backoff.delay(attempt)
                _log.warning("consumer %s on %s: JetStream unavailable (%s: %s); retrying in %.1fs",
                             config.durable_name, stream, type(exc).__name__, exc, delay)
                await asyncio.sleep(delay)

    def _forget(self, consumer: RunningConsumer) -> None:
        with contextlib.suppress(ValueError):
            self._consumers.remove(consumer)

    async def delete_consumer(self, durable: str, subjects: Sequence[str]) -> bool:
        """Remove a durable consumer (its position is lost). False if it did not exist."""
        try:
            return bool(await self.js.delete_consumer(self.names.stream_for(subjects), durable))
        except NotFoundError:
            return False


class _SslEofNotice(logging.Filter):
    """asyncio warns "returning true from eof_received() has no effect when using ssl" each time a
    TLS peer closes a stream-based connection (as nats-py's transport is): harmless, and printed in
    the middle of `corral demo`'s output for a newcomer. Only that message is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "eof_received() has no effect when using ssl" not in record.getMessage()


def _quiet_ssl_eof_notice() -> None:
    """`_SslEofNotice` on asyncio's logger, once: what a connection over asyncio's TLS transport
    needs (a request published without nats-py uses a blocking socket, and no logging)."""
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, _SslEofNotice) for f in asyncio_log.filters):
        asyncio_log.addFilter(_SslEofNotice())
