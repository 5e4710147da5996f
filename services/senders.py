"""Who sent an inbox request, as its subject names them, and the request as that sender made it.

NATS permissions (`corral.bus.auth`) let an identity publish only subjects naming itself: a user
`<ns>.inbox.user.<user>.<Type>`, an admin also `<ns>.inbox.admin.<admin>.<Type>`, a node agent
`<ns>.inbox.node.<node>.<Type>`. So the subject, not the message, says who asks, and an admin is
whoever publishes on an admin subject (no list of admins in the services' environment). A bare
`<ns>.inbox.<Type>` names no one: only a superuser can publish it (the test suite, an open bus).
Pure and I/O-free.
"""

from __future__ import annotations

import msgspec

from corral.contracts.envelope import Event
from corral.contracts.subjects import Subjects


class Sender(msgspec.Struct, frozen=True):
    """A user or an admin named by a request's subject."""

    name: str
    admin: bool = False

    @property
    def actor(self) -> str:
        """The actor recorded for its requests: `admin/<name>` or `user/<name>`."""
        return f"admin/{self.name}" if self.admin else f"user/{self.name}"


def sender_of(subjects: Subjects, subject: str) -> Sender | None:
    """The user or admin an inbox subject names; None for a bare subject (a superuser's) or a node's."""
    principal = subjects.principal_of(subject)
    if principal is None or principal[0] not in ("user", "admin"):
        return None
    return Sender(principal[1], admin=principal[0] == "admin")


def as_sent_by(event: Event, sender: Sender | None) -> Event:
    """The request as its sender made it: its `user` (if it has one) is the one the subject names,
    never the one written in the message, and its actor the sender's (`Sender.actor`)."""
    if sender is None:
        return event
    fields = {"actor": sender.actor}
    if "user" in event.__struct_fields__:
        fields["user"] = sender.name
    if all(getattr(event, k) == v for k, v in fields.items()):
        return event
    return msgspec.structs.replace(event, **fields)


def type_mismatch(subjects: Subjects, subject: str, event: Event) -> str | None:
    """Why a request must not be taken: its body is another type than its subject is for (a body
    of a type the sender may not publish, on a subject it may). None when they agree."""
    said = subjects.type_of(subject)
    return None if said == event.type else f"a {event.type} on {subject}, a subject for {said}"
