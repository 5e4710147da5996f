"""Log lines a machine can read: `CORRAL_LOG_FORMAT=json` makes every line one JSON object with the
job id and the trace id, so a log store finds everything about one job (or one trace) at once.

Why: in free text ("job j01k... attempt 0 released: PREEMPTED ..."), finding one job's lines
takes a regular expression per message shape, and nothing ties a line to the trace of the request
that caused it. Each JSON line has `ts`, `level`, `logger`, `message`,
`service`, `job_id` and `trace_id` (the last two empty when unknown), plus `exc` on errors.

Where the job id comes from, first found wins: the `job_id` given with the record
(`log.info(..., extra={"job_id": j})`), the job being handled (`job_context(job_id)`, a context
variable), or the first job id in the message (Corral's ids are `j` + 14 characters of a ULID).
The job being handled is set by every durable consumer around its handler (`handling`, from
`corral.bus.consumer`): the message's job is its `Corral-Stream` header (`job-<id>`, what the
relay sets on a job's events) or else the `job_id` field of its JSON body (an inbox request:
JobSubmitted, JobCancelRequested); a batch about several jobs names none (its lines name their
own), and `corral.services.base` narrows it to each request while it handles them one by one.
The trace id is the current OpenTelemetry span's (`corral.telemetry.tracing` starts the spans;
with tracing off there is no current span and the field is empty) or whatever a function given
to `set_trace_id_source` returns.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Protocol

from corral import environment

LOG_FORMAT_ENV = "CORRAL_LOG_FORMAT"
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"

_JOB_ID = re.compile(r"\bj[0-9a-z]{14}\b")
_current_job: contextvars.ContextVar[str | None] = contextvars.ContextVar("corral_job_id", default=None)
#: The relay's header naming an event's stream (`corral.bus.relay.STREAM`; not imported: bus imports this).
STREAM_HEADER = "Corral-Stream"
_JOB_STREAM = "job-"
_JOB_FIELD = re.compile(rb'"job_id"\s*:\s*"([A-Za-z0-9][A-Za-z0-9._-]{0,127})"')


def _otel_trace_id() -> str:
    """The current OpenTelemetry span's trace id as 32 hex digits, or '' (no span, or no API)."""
    try:
        from opentelemetry import trace
    except ImportError:  # pragma: no cover - opentelemetry-sdk is a dependency
        return ""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else ""


class _TraceIds:
    """Where trace ids come from (the hook `corral.telemetry.tracing` may replace)."""

    source: Callable[[], str] = staticmethod(_otel_trace_id)


def set_trace_id_source(source: Callable[[], str]) -> None:
    """Use `source()` for every line's trace id (default: the current OpenTelemetry span's)."""
    _TraceIds.source = staticmethod(source)


@contextlib.contextmanager
def job_context(job_id: str | None) -> Iterator[None]:
    """Lines logged inside carry `job_id` (unless they name their own)."""
    token = _current_job.set(job_id)
    try:
        yield
    finally:
        _current_job.reset(token)


class Message(Protocol):
    """A consumed message (`corral.bus.Delivery`)."""

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def data(self) -> bytes: ...


def job_of_message(message: Message) -> str | None:
    """The job a message is about: its `Corral-Stream: job-<id>` header, else its body's `job_id`."""
    stream = message.headers.get(STREAM_HEADER, "")
    if stream.startswith(_JOB_STREAM):
        return stream[len(_JOB_STREAM):] or None
    found = _JOB_FIELD.search(message.data)
    return found.group(1).decode() if found else None


def handling(messages: Sequence[Message]) -> contextlib.AbstractContextManager[None]:
    """Around handling consumed messages: lines logged inside carry their job id when they are
    all about one job (always so for one message), none otherwise."""
    jobs = {job_of_message(m) for m in messages}
    job = jobs.pop() if len(jobs) == 1 else None
    return job_context(job) if job is not None or _current_job.get() is not None else contextlib.nullcontext()


def job_id_of(record: logging.LogRecord) -> str:
    given = getattr(record, "job_id", None)
    if given:
        return str(given)
    current = _current_job.get()
    if current:
        return current
    found = _JOB_ID.search(record.getMessage())
    return found.group(0) if found else ""


class JsonFormatter(logging.Formatter):
    """One JSON object per line (see the module docstring for the fields)."""

    def __init__(self, service: str = "") -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        try:
            trace_id = _TraceIds.source()
        except Exception:
            trace_id = ""
        line = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "service": self.service,
            "message": record.getMessage(),
            "job_id": job_id_of(record),
            "trace_id": trace_id,
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure(service: str = "", level: str | None = None) -> None:
    """Configure the root logger as every Corral process does: text by default, JSON lines with
    `CORRAL_LOG_FORMAT=json`; the level from `CORRAL_LOG_LEVEL` (INFO)."""
    level = level or environment.get("CORRAL_LOG_LEVEL") or "INFO"
    if (environment.get(LOG_FORMAT_ENV) or "text").strip().lower() == "json":
        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter(service))
        logging.basicConfig(level=level, handlers=[handler], force=True)
        logging.captureWarnings(True)  # warnings as JSON lines too
    else:
        logging.basicConfig(level=level, format=TEXT_FORMAT)
