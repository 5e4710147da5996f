"""Where each event type flows: who writes it, on which stream, through which inbox, who is sent it.

Each event class declares its `Flow` once (`flow: ClassVar[Flow]` in `corral.contracts.events`);
the inbox subjects and NATS permissions (`corral.contracts.subjects`), each service's durable
consumer filter, its inbox subjects and the events it folds when it appends them derive from
those declarations (`corral.contracts.routes`). tests/unit/contracts/test_flow.py
checks that every event has a writer, that every consumer folds what it is sent, and that
services name event types by class, never by a bare string.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import msgspec

from corral.contracts.envelope import Event

__all__ = [
    "ADMIN_CLI",
    "ADMISSION",
    "CONSUMERS",
    "NODE_AGENT",
    "PLACEMENT",
    "PREEMPTION",
    "QUOTA",
    "RELAY",
    "SENDER_KINDS",
    "Flow",
    "Sender",
    "StreamKind",
    "flow_of",
    "names",
]

#: The services that decide and append (their `Service.name`), the node agents, the outbox relay
#: and the admin's CLI (`corral user` records people changes itself).
ADMISSION = "admission"
QUOTA = "quota"
PLACEMENT = "placement"
PREEMPTION = "preemption"
NODE_AGENT = "node_agent"
RELAY = "relay"
ADMIN_CLI = "admin_cli"
#: Who may be sent events from `<ns>.events.<Type>` (durable consumers).
CONSUMERS: tuple[str, ...] = (ADMISSION, QUOTA, PLACEMENT, PREEMPTION, NODE_AGENT)

Sender = Literal["node", "user", "admin"]
#: The kinds of sender an inbox subject may name (`Subjects.sender_of`).
SENDER_KINDS: tuple[Sender, ...] = ("node", "user", "admin")
#: `job-<id>`, `node-<name>`, `queue-<name>`, `queues` (tree versions), `queues-gate` (refused
#: changes), `policy` (the scheduling policy in force), `cluster`, `people`; `heartbeat` is core
#: NATS only, never the log.
StreamKind = Literal["job", "node", "queue", "queues", "queues-gate", "policy", "cluster", "people", "heartbeat"]


class Flow(msgspec.Struct, frozen=True, kw_only=True):
    """One event type's wiring. `writers`: who appends it to the log (the first is its owner, which
    records it when it arrives through the inbox); `inbox`: the senders that may send it to
    `<ns>.inbox.<kind>.<name>.<Type>` (empty: never sent, only appended); `consumers`: the processes
    sent it from `<ns>.events.<Type>`, each of which folds it (none: the relay does not publish it,
    the log alone holds it; `corral.contracts.routes.relayed_types`)."""

    writers: tuple[str, ...]
    stream: StreamKind
    inbox: tuple[Sender, ...] = ()
    consumers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.writers:
            raise ValueError("an event's flow names at least one writer")
        unknown = set(self.consumers) - set(CONSUMERS)
        if unknown:
            raise ValueError(f"consumers {sorted(unknown)}: not one of {', '.join(CONSUMERS)}")
        if set(self.inbox) - set(SENDER_KINDS):
            raise ValueError(f"inbox {self.inbox}: sender kinds are {', '.join(SENDER_KINDS)}")


def flow_of(cls: type[Event]) -> Flow:
    flow = getattr(cls, "flow", None)
    if not isinstance(flow, Flow):
        raise TypeError(f"{cls.__name__} declares no `flow: ClassVar[Flow]`")
    return flow


def names(classes: Iterable[type[Event]]) -> tuple[str, ...]:
    """The wire type names of `classes`, in their order."""
    return tuple(cls.type_name() for cls in classes)
