"""NATS subjects of Corral, under a namespace prefix.

Why a prefix: tests share one nats-server, and two clusters may share one NATS account; a
unique prefix (e.g. `t3f9a`) isolates them completely. The default prefix is `corral`.

- `<prefix>.events.<Type>`: every appended event, published by the outbox relay.
- `<prefix>.events.node.<node>.<Kind>` (`NODE_WORK_TYPES`): what one node's agent acts on, published
  by the relay from the log in the log's order, only to the nodes a job touches (its gangs' nodes):
  `NodeAssignment` (a GangReserved with the job's JobSubmitted and its queue's QueueConfigured,
  `corral.contracts.node_work`), and the log's own PreemptRequested, GangReleased, JobCancelled,
  JobRequeued, NodeLost. An agent's NATS identity reads only its own node's (`corral.bus.auth`).
- `<prefix>.inbox.<Type>` (bare, `INBOX_TYPES`): a request or node report naming no sender. No generated
  configuration lets any identity publish there; only a superuser (the test suite's session NATS,
  an open bus) can, and services take it as the superuser's.
- `<prefix>.inbox.node.<node>.<Type>`: the same reports, on a subject naming the reporting node, so
  NATS permissions let a node identity publish only its own (see `corral.bus.auth`); placement
  accepts a report only when the subject's node is the report's node and holds the gang.
- `<prefix>.inbox.user.<user>.<Type>` (`USER_REQUEST_TYPES`): a request on a subject naming the
  submitting identity: the user recorded is the subject's (the credential's), never the spec's.
- `<prefix>.inbox.admin.<admin>.<Type>` (`ADMIN_REQUEST_TYPES`): an admin's request (queues, drain,
  cancel/hold/release/requeue of any job) on a subject naming the admin; only an admin identity may
  publish its own, so the subject is what proves admin-ness, and the admin is the recorded actor
  (`admin/<admin>`).
- `<prefix>.admin.<admin>.dlq-replay`: an admin's request (core NATS, request/reply) that a service
  republish a dead letter (`corral.services.dead_letter_replay`).
- `<prefix>.heartbeat.<node>`: node heartbeats on core NATS (not JetStream, not the log).
- `<prefix>.dlq.<STREAM>.<seq>`: what a consumer could never process, one entry per original
  message (see `corral.bus.naming.Namespace.dead_letter_subject`; the consumer is in its headers).
  The inbox stream takes only the `INBOX_TYPES` subjects: add a new request type there.
"""

from __future__ import annotations

import re

import msgspec

from corral.contracts.envelope import Event
from corral.contracts.flow import SENDER_KINDS
from corral.contracts.node_work import NODE_WORK_TYPES as node_work_kinds
from corral.contracts.routes import inbox_types

__all__ = [
    "ADMIN_REQUEST_TYPES",
    "DEFAULT_PREFIX",
    "EVENTS_WILDCARD",
    "INBOX_JOB_CANCEL_REQUESTED",
    "INBOX_JOB_SUBMITTED",
    "INBOX_TYPES",
    "INBOX_WILDCARD",
    "NODE_REPORT_TYPES",
    "NODE_WORK_TYPES",
    "SENDER_KINDS",
    "USER_REQUEST_TYPES",
    "Subjects",
    "inbox_subject_for",
    "subject_for",
]

DEFAULT_PREFIX = "corral"
#: Requests from outside the event log: users and pipelines (jobs, queue configuration) and node
#: agents (their reports; agents have no database, placement records what they say). Each event
#: class's `flow.inbox` declares who may send it (`corral.contracts.flow`).
INBOX_TYPES: tuple[str, ...] = inbox_types()
#: Reports a node agent publishes on `<prefix>.inbox.node.<node>.<Type>`.
NODE_REPORT_TYPES: tuple[str, ...] = inbox_types("node")
#: What the relay publishes on `<prefix>.events.node.<node>.<Kind>` for the agent of each node a
#: job touches: the assignment (a `NodeAssignment`), then the log's events that stop or signal it.
NODE_WORK_TYPES: tuple[str, ...] = node_work_kinds
#: Requests a submitter publishes on `<prefix>.inbox.user.<user>.<Type>`.
USER_REQUEST_TYPES: tuple[str, ...] = inbox_types("user")
#: Requests an admin publishes on `<prefix>.inbox.admin.<admin>.<Type>`: configuring queues,
#: draining nodes and acting on anyone's job.
ADMIN_REQUEST_TYPES: tuple[str, ...] = inbox_types("admin")
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

    def node_work(self, node: str, kind: str) -> str:
        """`<prefix>.events.node.<node>.<Kind>`: work for one node's agent (`NODE_WORK_TYPES`)."""
        if kind not in NODE_WORK_TYPES:
            raise ValueError(f"{kind} is not node work; node work: {', '.join(NODE_WORK_TYPES)}")
        return f"{self.prefix}.events.node.{_identity_token('node', node)}.{kind}"

    def node_work_wildcard(self, node: str) -> str:
        """`<prefix>.events.node.<node>.>`: everything one node's agent consumes."""
        return f"{self.prefix}.events.node.{_identity_token('node', node)}.>"

    @property
    def broadcast_events(self) -> str:
        """`<prefix>.events.*`: the log's events, without the per-node copies (`node_work`)."""
        return f"{self.prefix}.events.*"

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

    def admin_request(self, admin: str, type_name: str) -> str:
        """`<prefix>.inbox.admin.<admin>.<Type>`: an admin's request, on a subject naming the admin."""
        if type_name not in ADMIN_REQUEST_TYPES:
            raise ValueError(f"{type_name} is not an admin request; requests: {', '.join(ADMIN_REQUEST_TYPES)}")
        return f"{self.prefix}.inbox.admin.{_identity_token('admin', admin)}.{type_name}"

    def dead_letter_replay(self, admin: str) -> str:
        """`<prefix>.admin.<admin>.dlq-replay`: an admin asks a service to replay dead letters."""
        return f"{self.prefix}.admin.{_identity_token('admin', admin)}.dlq-replay"

    @property
    def dead_letter_replay_wildcard(self) -> str:
        return f"{self.prefix}.admin.*.dlq-replay"

    def sender_of(self, subject: str, kind: str) -> str | None:
        """The node (kind "node"), user ("user") or admin ("admin") named by an inbox subject; None
        if the subject names none of that kind (another kind, or a bare `<prefix>.inbox.<Type>`)."""
        if kind not in SENDER_KINDS:
            raise ValueError(f"sender kind {kind!r}: one of {', '.join(SENDER_KINDS)}")
        head = f"{self.prefix}.inbox.{kind}."
        if not subject.startswith(head):
            return None
        name, _, rest = subject[len(head):].partition(".")
        return name.replace("~", ".") if name and rest and "." not in rest else None

    def principal_of(self, subject: str) -> tuple[str, str] | None:
        """(kind, name) of the sender an inbox subject names (`SENDER_KINDS`); None for a bare one."""
        for kind in SENDER_KINDS:
            name = self.sender_of(subject, kind)
            if name is not None:
                return kind, name
        return None

    @staticmethod
    def type_of(subject: str) -> str:
        """The request type an inbox subject is for: its last token."""
        return subject.rpartition(".")[2]

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
