"""NATS subjects of Corral, under a namespace prefix.

Why a prefix: tests share one nats-server, and two clusters may share one NATS account; a
unique prefix (e.g. `t3f9a`) isolates them completely. The default prefix is `corral`.

- `<prefix>.events.<Type>`: every appended event, published by the outbox relay.
- `<prefix>.inbox.JobSubmitted`, `<prefix>.inbox.JobCancelRequested`: requests from the CLI or
  any pipeline, before anything is in the event log (deduplicated by `Nats-Msg-Id` = event_id).
- `<prefix>.inbox.QueueConfigured`: `corral apply queues.yaml`; quota records it.
- `<prefix>.inbox.<NodeRegistered|WorkerStarted|WorkerExited|CheckpointDone|NodeConditionsChanged>`: node agent reports;
  placement records them in the log.
- `<prefix>.inbox.node.<node>.<Type>`: the same reports, on a subject naming the reporting node, so
  NATS permissions let a node identity publish only its own (see `corral.bus.auth`); placement
  accepts a report only when the subject's node is the report's node and holds the gang.
- `<prefix>.inbox.user.<user>.<JobSubmitted|JobCancelRequested>`: a request on a subject naming the
  submitting identity: the user recorded is the subject's (the credential's), never the spec's.
- `<prefix>.heartbeat.<node>`: node heartbeats on core NATS (not JetStream, not the log).
- `<prefix>.dlq.<STREAM>.<seq>`: what a consumer could never process, one entry per original
  message (see `corral.bus.naming.Namespace.dead_letter_subject`; the consumer is in its headers).
  The inbox stream takes only the `INBOX_TYPES` subjects: add a new request type there.
"""

from __future__ import annotations

import re

import msgspec

from corral.contracts.envelope import Event

__all__ = [
    "DEFAULT_PREFIX",
    "EVENTS_WILDCARD",
    "INBOX_JOB_CANCEL_REQUESTED",
    "INBOX_JOB_SUBMITTED",
    "INBOX_TYPES",
    "INBOX_WILDCARD",
    "NODE_REPORT_TYPES",
    "USER_REQUEST_TYPES",
    "Subjects",
    "inbox_subject_for",
    "subject_for",
]

DEFAULT_PREFIX = "corral"
#: Requests from outside the event log: users and pipelines (jobs, queue configuration) and node
#: agents (their reports; agents have no database, placement records what they say).
INBOX_TYPES: tuple[str, ...] = ("JobSubmitted", "JobCancelRequested", "JobHeld", "JobHoldReleased",
                                "JobRequeueRequested", "QueueConfigured", "QueueTreeApplied", "QueueChangeRefused",
                                "NodeDrained", "NodeUndrained", "NodeRegistered", "WorkerStarted", "WorkerExited",
                                "CheckpointDone", "NodeConditionsChanged")
#: Reports a node agent publishes on `<prefix>.inbox.node.<node>.<Type>`.
NODE_REPORT_TYPES: tuple[str, ...] = ("NodeRegistered", "WorkerStarted", "WorkerExited", "CheckpointDone",
                                      "NodeConditionsChanged")
#: Requests a submitter publishes on `<prefix>.inbox.user.<user>.<Type>`.
USER_REQUEST_TYPES: tuple[str, ...] = ("JobSubmitted", "JobCancelRequested", "JobHeld", "JobHoldReleased",
                                       "JobRequeueRequested")
_IDENTITY_TOKEN = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$")
_PREFIX = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")


class Subjects(msgspec.Struct, frozen=True):
    """All subjects and JetStream stream names for one namespace prefix."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if not _PREFIX.match(self.prefix):
            raise ValueError(f"subject prefix {self.prefix!r}: use letters, digits, '_', '-' and dots")

    def event(self, type_name: str) -> str:
        return f"{self.prefix}.events.{type_name}"

    def inbox(self, type_name: str) -> str:
        if type_name not in INBOX_TYPES:
            raise ValueError(f"{type_name} is not an inbox type; inbox types: {', '.join(INBOX_TYPES)}")
        return f"{self.prefix}.inbox.{type_name}"

    def node_report(self, node: str, type_name: str) -> str:
        """`<prefix>.inbox.node.<node>.<Type>`: a node agent's report, on a subject naming its node."""
        if type_name not in NODE_REPORT_TYPES:
            raise ValueError(f"{type_name} is not a node report; reports: {', '.join(NODE_REPORT_TYPES)}")
        return f"{self.prefix}.inbox.node.{_identity_token('node', node)}.{type_name}"

    def user_request(self, user: str, type_name: str) -> str:
        """`<prefix>.inbox.user.<user>.<Type>`: a submitter's request, on a subject naming its user."""
        if type_name not in USER_REQUEST_TYPES:
            raise ValueError(f"{type_name} is not a user request; requests: {', '.join(USER_REQUEST_TYPES)}")
        return f"{self.prefix}.inbox.user.{_identity_token('user', user)}.{type_name}"

    def sender_of(self, subject: str, kind: str) -> str | None:
        """The node (kind "node") or user (kind "user") named by an inbox subject; None if the
        subject names none (an old-style `<prefix>.inbox.<Type>` subject)."""
        head = f"{self.prefix}.inbox.{kind}."
        if not subject.startswith(head):
            return None
        name, _, rest = subject[len(head):].partition(".")
        return name.replace("~", ".") if name and rest and "." not in rest else None

    def heartbeat(self, node: str) -> str:
        return f"{self.prefix}.heartbeat.{node}"

    @property
    def heartbeat_wildcard(self) -> str:
        return f"{self.prefix}.heartbeat.*"

    def dead_letter(self, consumer: str) -> str:
        return f"{self.prefix}.dlq.{consumer}"

    @property
    def events_wildcard(self) -> str:
        return f"{self.prefix}.events.>"

    @property
    def inbox_wildcard(self) -> str:
        return f"{self.prefix}.inbox.>"

    @property
    def dead_letter_wildcard(self) -> str:
        return f"{self.prefix}.dlq.>"

    @property
    def job_submitted(self) -> str:
        return self.inbox("JobSubmitted")

    @property
    def job_cancel_requested(self) -> str:
        return self.inbox("JobCancelRequested")

    def _stream(self, kind: str) -> str:
        return re.sub(r"[^A-Za-z0-9_-]", "_", self.prefix).upper() + "_" + kind

    @property
    def events_stream(self) -> str:
        """JetStream stream name holding `events_wildcard` (stream names cannot contain dots)."""
        return self._stream("EVENTS")

    @property
    def inbox_stream(self) -> str:
        return self._stream("INBOX")

    @property
    def dead_letter_stream(self) -> str:
        return self._stream("DLQ")

    def subject_for(self, event: Event) -> str:
        return self.event(event.type)

    def inbox_subject_for(self, event: Event) -> str:
        return self.inbox(event.type)


def _identity_token(kind: str, name: str) -> str:
    """A node or user name as one subject token: a dot (allowed in node names) becomes `~`."""
    if not _IDENTITY_TOKEN.match(name):
        raise ValueError(f"{kind} name {name!r} cannot be a subject token: use letters, digits, '.', '_' or '-'")
    return name.replace(".", "~")


_DEFAULT = Subjects()
EVENTS_WILDCARD = _DEFAULT.events_wildcard
INBOX_WILDCARD = _DEFAULT.inbox_wildcard
INBOX_JOB_SUBMITTED = _DEFAULT.job_submitted
INBOX_JOB_CANCEL_REQUESTED = _DEFAULT.job_cancel_requested


def subject_for(event: Event, prefix: str = DEFAULT_PREFIX) -> str:
    """`<prefix>.events.<Type>`: where the outbox relay publishes an appended event."""
    return Subjects(prefix).subject_for(event)


def inbox_subject_for(event: Event, prefix: str = DEFAULT_PREFIX) -> str:
    """`<prefix>.inbox.<Type>` for JobSubmitted / JobCancelRequested; ValueError for other types."""
    return Subjects(prefix).inbox_subject_for(event)
