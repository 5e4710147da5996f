"""Subject and stream names of one Corral installation, derived from its namespace.

Why: several Corral clusters (and every test) may share one NATS account; a namespace prefixes
every subject and stream so they never see each other's messages. Pure and I/O-free.

Namespace "corral" gives subjects `corral.events.JobSubmitted`, `corral.inbox.<name>`,
`corral.dlq.<STREAM>.<seq>` (one dead letter per original message),
`corral.logs.<job>.<attempt>.<node>.<rank>` (ranks' output, see `corral.contracts.logs`) and
streams `CORRAL_EVENTS`, `CORRAL_INBOX`, `CORRAL_DLQ`, `CORRAL_LOGS`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

_NAMESPACE = re.compile(r"^[A-Za-z0-9_-]+$")
_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")
_SUBJECT_TAIL = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
# '~' stands for a '.' in a node name or job id (one token: see corral.contracts.subjects, .logs)
_FILTER_TAIL = re.compile(r"^([A-Za-z0-9_~-]+|\*)(\.([A-Za-z0-9_~-]+|\*))*(\.>)?$|^>$")

EVENTS = "events"
INBOX = "inbox"
DLQ = "dlq"
LOGS = "logs"
KINDS = (EVENTS, INBOX, DLQ, LOGS)


_NOT_DURABLE_TOKEN = re.compile(r"[^A-Za-z0-9_-]")


def durable_name(nodes: Sequence[str]) -> str:
    """The durable consumer of a process hosting `nodes`.

    One node: `node-agent-<node>` ('.' becomes '_'). Several: `node-agents-<10 hex of sha1 of the
    sorted names>`, stable across restarts of the same node set. Two live processes must never
    host the same node set: they would share the durable and split its messages.
    """
    names = sorted(set(nodes))
    if not names:
        raise ValueError("a node-agent process hosts at least one node")
    if len(names) == 1:
        return f"node-agent-{_NOT_DURABLE_TOKEN.sub('_', names[0])}"
    digest = hashlib.sha1("\n".join(names).encode()).hexdigest()[:10]
    return f"node-agents-{digest}"


def history_consumer(durable: str) -> str:
    """The one-shot consumer a process that consumes with `durable` reads past events with.

    Named after the durable (not random) so that an identity may be allowed exactly its own two
    consumers (`corral.bus.auth.agent`): NATS permissions match whole subject tokens, so a random
    name would need a wildcard that also names every other consumer of the stream."""
    return f"{durable}-history"


@dataclass(frozen=True, slots=True)
class Namespace:
    """The prefix of every subject and stream name of one installation."""

    name: str = "corral"

    def __post_init__(self) -> None:
        if not _NAMESPACE.match(self.name):
            raise ValueError(f"namespace must be letters, digits, '_' or '-' (it prefixes NATS subjects "
                             f"and stream names), got {self.name!r}")

    def stream(self, kind: str) -> str:
        """Stream name for `kind` (events, inbox, dlq or logs), e.g. CORRAL_EVENTS."""
        if kind not in KINDS:
            raise ValueError(f"stream kind must be one of {KINDS}, got {kind!r}")
        return f"{self.name.upper()}_{kind.upper()}"

    @property
    def dead_letter_stream(self) -> str:
        return self.stream(DLQ)

    def wildcard(self, kind: str) -> str:
        """All subjects of a stream, e.g. corral.events.>"""
        self.stream(kind)
        return f"{self.name}.{kind}.>"

    def events_subject(self, event_type: str) -> str:
        """Where events of `event_type` are published, e.g. corral.events.JobSubmitted."""
        if not _TOKEN.match(event_type):
            raise ValueError(f"event type must be one subject token (letters, digits, '_' or '-'), "
                             f"got {event_type!r}")
        return f"{self.name}.{EVENTS}.{event_type}"

    def inbox_subject(self, name: str) -> str:
        """A command/inbox subject, e.g. corral.inbox.placement.requests."""
        if not _SUBJECT_TAIL.match(name):
            raise ValueError(f"inbox name must be dot-separated tokens without wildcards, got {name!r}")
        return f"{self.name}.{INBOX}.{name}"

    def dlq_subject(self, durable: str) -> str:
        """Where consumer `durable` dead-letters what it can never process."""
        if not _TOKEN.match(durable):
            raise ValueError(f"durable name must be one token (letters, digits, '_' or '-'), got {durable!r}")
        return f"{self.name}.{DLQ}.{durable}"

    def dead_letter_subject(self, stream: str, sequence: int) -> str:
        """Where the dead letter of message `sequence` of `stream` goes: one subject per original
        message, e.g. corral.dlq.CORRAL_INBOX.42 (the consumer is in its headers)."""
        if not _TOKEN.match(stream) or sequence < 1:
            raise ValueError(f"dead letter origin must be a stream name and a sequence >= 1, got "
                             f"{stream!r}, {sequence!r}")
        return f"{self.name}.{DLQ}.{stream}.{sequence}"

    def kind_of(self, subject: str) -> str:
        """Which stream kind a (possibly wildcard) subject belongs to; ValueError if none."""
        prefix, _, rest = subject.partition(".")
        kind, _, tail = rest.partition(".")
        if prefix != self.name or kind not in KINDS or not _FILTER_TAIL.match(tail):
            raise ValueError(f"subject {subject!r} is not under namespace {self.name!r}: expected "
                             f"{self.name}.<events|inbox|dlq|logs>.<tokens>")
        return kind

    def stream_for(self, subjects: Sequence[str]) -> str:
        """The one stream that holds all `subjects` (a consumer reads from exactly one stream)."""
        if not subjects:
            raise ValueError("a consumer needs at least one subject")
        kinds = {self.kind_of(subject) for subject in subjects}
        if len(kinds) != 1:
            raise ValueError(f"subjects {list(subjects)} span several streams ({sorted(kinds)}); "
                             "use one consumer per stream")
        return self.stream(kinds.pop())
