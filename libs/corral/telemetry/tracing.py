"""One trace per job, across every process it passes through: OpenTelemetry spans over the bus.

Why: a job crosses the CLI, admission, quota, placement, preemption and a node agent,
which talk only through NATS and the Postgres log, often several hops apart and batched (one
append or one cycle covers many jobs). A span context kept in memory dies at the first hop.

The fix, in the infrastructure layers only (services need not know):
- a request published to the inbox carries a W3C `traceparent` header (`corral submit`'s span,
  or a node agent's report span, child of the span that received the job's GangReserved);
- a consumer (`corral.bus.consumer`) starts a receive span as the child of the message's
  `traceparent` and remembers it as its job's latest context (by `Corral-Correlation-Id`,
  which is the job id for every job event);
- an append (`corral.eventstore.store`) starts one span per traced job in it, as the child of
  that job's latest context, around the asyncpg call, and stores each event's `traceparent` with
  the event (the `trace_context` column: not part of the event, nor of the hash chain);
- the outbox relay (`corral.bus.relay`) publishes each event with a child span's `traceparent`,
  so every consumer continues the trace, in whichever process it runs.

Off by default and then free: nothing of the SDK is imported, and each hook is one call that
returns at once. On when `OTEL_TRACES_EXPORTER` names an exporter (`otlp` — configured by the
standard `OTEL_EXPORTER_OTLP_*` variables, HTTP/protobuf —, `console`) or `CORRAL_TRACE_FILE`
names a file that every process appends its spans to as JSON lines (tests, debugging).
`OTEL_SDK_DISABLED=true` turns everything off. The service name is `OTEL_SERVICE_NAME`, else the
name the process gives its NATS connection.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from corral import environment

TRACEPARENT = "traceparent"
CORRELATION = "Corral-Correlation-Id"  # the same header the relay sets (corral.bus.relay.CORRELATION_ID)
FILE_ENV = "CORRAL_TRACE_FILE"
_REMEMBERED = 10_000  # jobs whose latest span context a process keeps (least recently used dropped)


class Appended(Protocol):
    """What `appending` needs of an event about to be appended (`corral.eventstore.NewEvent`)."""

    @property
    def event_id(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def stream(self) -> str: ...
    @property
    def correlation_id(self) -> str | None: ...


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for traces (see the module doc)."""
    env = environment.mapping() if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = [e.strip() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()]
    return bool(env.get(FILE_ENV)) or any(e != "none" for e in exporters)


class _Tracing:
    """The process's tracer, created on first use by `configure`; None while tracing is off."""

    def __init__(self) -> None:
        self.checked = False
        self.on = False
        self.tracer: Any = None
        self.provider: Any = None
        self.propagator: Any = None
        self.latest: OrderedDict[str, Any] = OrderedDict()  # correlation id -> span context
        self.lock = threading.Lock()


_state = _Tracing()


def enabled() -> bool:
    """True when this process records spans. The first call reads the environment."""
    if not _state.checked:
        _state.checked = True
        _state.on = wanted()
    return _state.on


def configure(service_name: str) -> bool:
    """Set the SDK up once for this process (when tracing is wanted), named `service_name` unless
    `OTEL_SERVICE_NAME` says otherwise. Returns whether tracing is on. Cheap when off."""
    if not enabled() or _state.tracer is not None:
        return _state.on
    with _state.lock:
        if _state.tracer is None:
            _setup(environment.get("OTEL_SERVICE_NAME") or service_name)
    return True


def _setup(service_name: str) -> None:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    for name in [e.strip() for e in (environment.get("OTEL_TRACES_EXPORTER") or "").split(",") if e.strip()]:
        if name == "otlp":
            provider.add_span_processor(BatchSpanProcessor(_otlp_exporter()))
        elif name == "console":
            provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
        elif name != "none":
            _log().warning("OTEL_TRACES_EXPORTER: unknown exporter %r ignored (use otlp, console or none)", name)
    trace_file = environment.get(FILE_ENV)
    if trace_file:
        exporter: Any = JsonLinesExporter(Path(trace_file), service_name)  # a SpanExporter by duck typing
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    _state.provider = provider
    _state.propagator = TraceContextTextMapPropagator()
    _state.tracer = provider.get_tracer("corral")


def _otlp_exporter() -> Any:
    protocol = environment.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environment.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc
            return Grpc()
        except ImportError:
            _log().warning("OTEL_EXPORTER_OTLP_PROTOCOL=grpc: the gRPC exporter is not installed "
                        "(pip install opentelemetry-exporter-otlp-proto-grpc); exporting over HTTP")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter()


def _log() -> Any:
    """This module's logger: `logging` is loaded when tracing is set up, not by a process that
    only asks whether it is on (a `corral` command)."""
    import logging

    return logging.getLogger(__name__)


def shutdown() -> None:
    """Flush and stop the exporters (also done at interpreter exit by the SDK)."""
    if _state.provider is not None:
        _state.provider.shutdown()


# ---- context --------------------------------------------------------------------------------

def _tracer() -> Any:
    if _state.tracer is None:
        configure("corral")
    return _state.tracer


def _parent(traceparent: str | None) -> Any:
    """An OTel Context whose parent is `traceparent` (None if it is absent or malformed)."""
    if not traceparent:
        return None
    from opentelemetry import trace

    context = _state.propagator.extract({TRACEPARENT: traceparent})
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def _context_of(span_context: Any) -> Any:
    from opentelemetry import trace

    return trace.set_span_in_context(trace.NonRecordingSpan(span_context))


def _traceparent(span: Any) -> str:
    from opentelemetry import trace

    carrier: dict[str, str] = {}
    _state.propagator.inject(carrier, context=trace.set_span_in_context(span))
    return carrier[TRACEPARENT]


def _remember(correlation_id: str | None, span: Any) -> None:
    if not correlation_id:
        return
    with _state.lock:
        _state.latest[correlation_id] = span.get_span_context()
        _state.latest.move_to_end(correlation_id)
        while len(_state.latest) > _REMEMBERED:
            _state.latest.popitem(last=False)


def _latest(correlation_id: str | None) -> Any:
    """The context a new span of this job continues: the job's latest span here, else the
    current span (a request being handled), else None."""
    if correlation_id:
        with _state.lock:
            known = _state.latest.get(correlation_id)
        if known is not None:
            return _context_of(known)
    from opentelemetry import trace

    current = trace.get_current_span()
    return None if not current.get_span_context().is_valid else trace.set_span_in_context(current)


class Stored(Protocol):
    """What `recall` needs of an event read from the log (`corral.eventstore.StoredEvent`)."""

    @property
    def correlation_id(self) -> str | None: ...
    @property
    def trace_context(self) -> str | None: ...


def recall(events: Sequence[Stored]) -> None:
    """Events read from the log: a job this process knows no span of yet continues from the trace
    context stored with its latest event (a service rebuilt after a restart keeps each job's
    trace going). A job with a span here already keeps it: the log is read behind live messages."""
    if not enabled():
        return
    latest: dict[str, str] = {}
    for event in events:
        if event.correlation_id and event.trace_context:
            latest[event.correlation_id] = event.trace_context
    if not latest:
        return
    from opentelemetry import trace

    _tracer()
    with _state.lock:
        fresh = {c: t for c, t in latest.items() if c not in _state.latest}
    for correlation, traceparent in fresh.items():
        parent = _parent(traceparent)
        if parent is not None:
            with _state.lock:
                _state.latest.setdefault(correlation, trace.get_current_span(parent).get_span_context())


# ---- hooks ----------------------------------------------------------------------------------

@contextlib.contextmanager
def span(name: str, **attributes: Any) -> Iterator[None]:
    """A span of this process's own (e.g. `corral submit`), current inside the block."""
    if not enabled():
        yield
        return
    from opentelemetry.trace import SpanKind

    with _tracer().start_as_current_span(name, kind=SpanKind.PRODUCER, attributes=_clean(attributes)):
        yield


class Message(Protocol):
    """What `receiving` needs of a consumed message (`corral.bus.Delivery`)."""

    @property
    def subject(self) -> str: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def data(self) -> bytes: ...


_OFF: contextlib.nullcontext[None] = contextlib.nullcontext()


def receiving(consumer: str, messages: Sequence[Message]) -> contextlib.AbstractContextManager[None]:
    """Around handling consumed messages: a CONSUMER span per message that carries a
    `traceparent`, child of it, remembered as its job's latest context (and current, for a
    single message) while the handler runs. Off: a shared no-op context, nothing else."""
    if not enabled() or not any(TRACEPARENT in m.headers for m in messages):
        return _OFF
    return _receiving(consumer, [m.headers for m in messages if TRACEPARENT in m.headers],
                      [m.subject for m in messages if TRACEPARENT in m.headers],
                      [_correlation(m) for m in messages if TRACEPARENT in m.headers])


def _correlation(message: Message) -> str | None:
    """The job a traced message is about: its `Corral-Correlation-Id` header, else (a pipeline that
    publishes its own requests with just a `traceparent`) the event's `correlation_id`."""
    known = message.headers.get(CORRELATION)
    if known:
        return known
    try:
        value = json.loads(message.data).get("correlation_id")
    except (ValueError, AttributeError, UnicodeDecodeError):
        return None
    return value if isinstance(value, str) and value else None


@contextlib.contextmanager
def _receiving(consumer: str, headers: Sequence[Mapping[str, str]], subjects: Sequence[str],
               correlations: Sequence[str | None]) -> Iterator[None]:
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind

    tracer = _tracer()
    spans = []
    for header, subject, correlation in zip(headers, subjects, correlations, strict=True):
        parent = _parent(header.get(TRACEPARENT))
        if parent is None:
            continue
        kind = subject.rsplit(".", 1)[-1]
        s = tracer.start_span(f"receive {kind}", context=parent, kind=SpanKind.CONSUMER, attributes=_clean({
            "messaging.system": "nats", "messaging.destination.name": subject,
            "messaging.consumer.group.name": consumer, "corral.correlation_id": correlation}))
        _remember(correlation, s)
        spans.append(s)
    try:
        if len(spans) == 1:
            with trace.use_span(spans[0], end_on_exit=False):
                yield
        else:
            yield
    finally:
        for s in spans:
            s.end()


def appending(events: Sequence[Appended], operation: str) -> contextlib.AbstractContextManager[dict[str, str] | None]:
    """Around an append: yields each event's `traceparent` to store with it (None when nothing is
    traced), from one CLIENT span per traced job, child of that job's latest context. Off: a
    shared no-op context that yields None."""
    if not enabled():
        return _OFF
    return _appending(events, operation)


@contextlib.contextmanager
def _appending(events: Sequence[Appended], operation: str) -> Iterator[dict[str, str] | None]:
    from opentelemetry.trace import SpanKind

    groups: dict[str, list[Appended]] = {}
    for event in events:
        groups.setdefault(event.correlation_id or "", []).append(event)
    tracer = _tracer()
    spans, traces = [], {}
    for correlation, group in groups.items():
        parent = _latest(correlation)
        if parent is None:
            continue
        s = tracer.start_span(f"{operation}", context=parent, kind=SpanKind.CLIENT, attributes=_clean({
            "db.system": "postgresql", "db.operation.name": operation, "corral.correlation_id": correlation,
            "corral.event_types": sorted({e.type for e in group}), "corral.streams": sorted({e.stream for e in group}),
            "corral.events": len(group)}))
        traceparent = _traceparent(s)
        traces.update({e.event_id: traceparent for e in group})
        spans.append(s)
    try:
        yield traces or None
    finally:
        for s in spans:
            s.end()


def relayed(trace_context: str | None, event_type: str, subject: str, position: int) -> str | None:
    """The `traceparent` the relay publishes an event with: a PRODUCER span, child of the
    context stored with the event (None when the event has none or tracing is off)."""
    if not trace_context or not enabled():
        return None
    parent = _parent(trace_context)
    if parent is None:
        return None
    from opentelemetry.trace import SpanKind

    s = _tracer().start_span(f"relay {event_type}", context=parent, kind=SpanKind.PRODUCER, attributes={
        "messaging.system": "nats", "messaging.destination.name": subject, "corral.position": position})
    try:
        return _traceparent(s)
    finally:
        s.end()


def outgoing(subject: str, headers: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """Headers for a message published to the bus: with a `traceparent` from a PRODUCER span,
    child of the current span or of the job's latest context (`Corral-Correlation-Id`), when
    there is one and the message has none yet."""
    if not enabled() or (headers is not None and TRACEPARENT in headers):
        return headers
    correlation = headers.get(CORRELATION) if headers else None
    parent = _latest(correlation)
    if parent is None:
        return headers
    from opentelemetry.trace import SpanKind

    kind = subject.rsplit(".", 1)[-1]
    s = _tracer().start_span(f"publish {kind}", context=parent, kind=SpanKind.PRODUCER, attributes=_clean({
        "messaging.system": "nats", "messaging.destination.name": subject, "corral.correlation_id": correlation}))
    try:
        return {**(headers or {}), TRACEPARENT: _traceparent(s)}
    finally:
        s.end()


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attributes.items() if v is not None}


# ---- the JSON-lines file exporter -------------------------------------------------------------

class JsonLinesExporter:
    """Appends each finished span to a file as one JSON line; several processes may share the file
    (each line is written with one `write` to a file opened for appending)."""

    def __init__(self, path: Path, service_name: str) -> None:
        self.path = path
        self.service_name = service_name
        path.parent.mkdir(parents=True, exist_ok=True)

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        lines = "".join(json.dumps(span_record(s, self.service_name), sort_keys=True) + "\n" for s in spans)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, lines.encode())
        finally:
            os.close(fd)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def span_record(span: Any, service_name: str) -> dict[str, Any]:
    """A finished SDK span as a plain dict (ids in hex, times in ns since the epoch)."""
    context = span.get_span_context()
    parent = span.parent
    return {
        "name": span.name,
        "service": span.resource.attributes.get("service.name", service_name),
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_span_id": f"{parent.span_id:016x}" if parent is not None else None,
        "kind": span.kind.name,
        "start": span.start_time,
        "end": span.end_time,
        "attributes": {k: list(v) if isinstance(v, tuple) else v for k, v in (span.attributes or {}).items()},
    }


def load_spans(path: Path) -> list[dict[str, Any]]:
    """The spans a `CORRAL_TRACE_FILE` holds (a line cut short by a killed process is skipped)."""
    spans = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            spans.append(json.loads(line))
    return spans
