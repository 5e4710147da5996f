"""`NodeAssignment`: what one node's agent needs to start its share of a gang, in one message.

Why one message: an agent starts ranks from a GangReserved, the job's spec (its JobSubmitted: the
command, the user it runs as) and its queue's `allow_root` (the newest QueueConfigured of the
spec's queue). Sent together on the subject of each node the gang touches
(`Subjects.node_work(node, "NodeAssignment")`), they reach only the agents that act on them: an
agent never reads another node's specs, and a job costs deliveries per node it touches, not per
node of the cluster.

The three are the log's own events, embedded as the log stores them (their bytes, any schema
version): decoding goes through the event registry, so an embedded JobSubmitted v1 is upcast like
any other. The wrapper is versioned too (`schema_version`); `UPCASTERS` lift an older wrapper to
the current one, and a newer one than this code knows is a ContractError naming the version, so
an agent older than its relay says so instead of guessing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from corral.contracts.envelope import Event
from corral.contracts.events import (
    GangReleased,
    GangReserved,
    JobCancelled,
    JobRequeued,
    JobSubmitted,
    NodeLost,
    PreemptRequested,
    QueueConfigured,
)
from corral.contracts.flow import names
from corral.contracts.problems import ContractError
from corral.contracts.registry import decode

__all__ = ["JOB_WORK", "KIND", "NODE_EVENTS", "NODE_WORK_TYPES", "SCHEMA_VERSION", "UPCASTERS", "Assignment",
           "NodeAssignment", "decode_assignment", "encode_assignment"]

KIND = "NodeAssignment"
#: Log events sent as they are to every node a gang of the job they name was reserved on.
JOB_WORK: tuple[type[Event], ...] = (PreemptRequested, GangReleased, JobCancelled, JobRequeued)
#: Log events sent to the node they name.
NODE_EVENTS: tuple[type[Event], ...] = (NodeLost,)
#: The kinds (last subject token) of `<prefix>.events.node.<node>.<Kind>`.
NODE_WORK_TYPES: tuple[str, ...] = (KIND, *names(JOB_WORK), *names(NODE_EVENTS))
_NULL = msgspec.Raw(b"null")
SCHEMA_VERSION = 1


class NodeAssignment(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The wire form: `reservation` a GangReserved, `submission` the job's JobSubmitted (null: the
    relay could not find it, or it is too large to send again; the agent then reports the ranks
    not started), `queue` the newest QueueConfigured of the spec's queue (null: none recorded);
    each an event as the log stores it (see that event's schema)."""

    kind: str = KIND
    schema_version: int = SCHEMA_VERSION
    reservation: msgspec.Raw
    submission: msgspec.Raw = msgspec.field(default_factory=lambda: _NULL)  # JSON null: none
    queue: msgspec.Raw = msgspec.field(default_factory=lambda: _NULL)


class Assignment(msgspec.Struct, frozen=True):
    """A decoded NodeAssignment."""

    reservation: GangReserved
    submission: JobSubmitted | None
    queue: QueueConfigured | None


#: (from_version, fn(dict) -> dict of from_version + 1): none yet, version 1 is the first.
UPCASTERS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}

_ENCODER = msgspec.json.Encoder()


def encode_assignment(reservation: bytes, submission: bytes | None, queue: bytes | None) -> bytes:
    """The NodeAssignment of stored events' bytes (not decoded again: the relay only forwards)."""
    return _ENCODER.encode(NodeAssignment(
        reservation=msgspec.Raw(reservation), submission=msgspec.Raw(submission) if submission else _NULL,
        queue=msgspec.Raw(queue) if queue else _NULL))


class _Header(msgspec.Struct):
    kind: str = ""
    schema_version: int = 0


def decode_assignment(data: bytes) -> Assignment:
    """The assignment in `data`, or a ContractError naming the field."""
    try:
        header = msgspec.json.decode(data, type=_Header)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ContractError(f"malformed {KIND}: {exc}") from exc
    if header.kind != KIND:
        raise ContractError(f"not a {KIND} (kind {header.kind!r})", field="kind")
    version = header.schema_version
    if version < 1:
        raise ContractError(f"{KIND}: schema_version must be an integer >= 1", field="schema_version")
    if version > SCHEMA_VERSION:
        raise ContractError(f"{KIND} v{version} is newer than this agent knows (v{SCHEMA_VERSION}): upgrade "
                            "the agent", field="schema_version")
    if version < SCHEMA_VERSION:
        doc = msgspec.json.decode(data)
        while version < SCHEMA_VERSION:
            doc = UPCASTERS[version](doc)
            version += 1
        data = _ENCODER.encode(doc)
    try:
        wire = msgspec.json.decode(data, type=NodeAssignment)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ContractError(f"invalid {KIND}: {exc}") from exc
    reservation = _embedded(wire.reservation, GangReserved, "reservation")
    submission = _embedded(wire.submission, JobSubmitted, "submission") if _given(wire.submission) else None
    queue = _embedded(wire.queue, QueueConfigured, "queue") if _given(wire.queue) else None
    assert isinstance(reservation, GangReserved)
    assert submission is None or isinstance(submission, JobSubmitted)
    assert queue is None or isinstance(queue, QueueConfigured)
    if submission is not None and submission.job_id != reservation.job_id:
        raise ContractError(f"{KIND}: the submission is of another job than the reservation", field="submission")
    return Assignment(reservation, submission, queue)


def _given(raw: msgspec.Raw) -> bool:
    return bytes(raw).strip() not in (b"", b"null")


def _embedded(raw: msgspec.Raw, cls: type[Event], field: str) -> Event:
    try:
        event = decode(bytes(raw))
    except ContractError as exc:
        raise ContractError(f"{KIND}.{field}: {exc}", field=field) from exc
    if not isinstance(event, cls):
        raise ContractError(f"{KIND}.{field} is a {event.type}, not a {cls.type_name()}", field=field)
    return event
