"""Each service's share of the event flow, derived from every event class's `Flow`.

Apart from `corral.contracts.flow` because these read every event class, and the event classes
import `flow` to declare theirs.
"""

from __future__ import annotations

from corral.contracts.envelope import Event
from corral.contracts.events import ALL_EVENTS, GangReserved
from corral.contracts.flow import SENDER_KINDS, Sender, flow_of, names
from corral.contracts.node_work import JOB_WORK, NODE_EVENTS

__all__ = ["consumed_by", "inbox_of", "inbox_types", "relayed_types", "written_by"]


def consumed_by(consumer: str) -> tuple[type[Event], ...]:
    """The event classes `consumer`'s durable consumer is sent."""
    return tuple(cls for cls in ALL_EVENTS if consumer in flow_of(cls).consumers)


def relayed_types() -> frozenset[str]:
    """The type names the outbox relay publishes on `<ns>.events.<Type>`: those some process is sent
    (`Flow.consumers`) and those node agents' work is made of (`corral.contracts.node_work`). The
    others are read from the log alone (`corral.bus.relay`)."""
    return frozenset((*(cls.type_name() for cls in ALL_EVENTS if flow_of(cls).consumers),
                      *names((*JOB_WORK, *NODE_EVENTS)), GangReserved.type_name()))


def written_by(writer: str) -> tuple[type[Event], ...]:
    """The event classes `writer` appends."""
    return tuple(cls for cls in ALL_EVENTS if writer in flow_of(cls).writers)


def inbox_types(kind: Sender | None = None) -> tuple[str, ...]:
    """The type names sent to the inbox (by senders of `kind`; None: by anyone)."""
    return tuple(cls.type_name() for cls in ALL_EVENTS
                 if flow_of(cls).inbox and (kind is None or kind in flow_of(cls).inbox))


def inbox_of(owner: str) -> tuple[str, ...]:
    """A service's inbox subjects after `<ns>.inbox.`: each request or report it owns, bare (only a
    superuser may publish those) and on `<kind>.*.<Type>` for each kind of sender it accepts."""
    owned = [cls for cls in ALL_EVENTS if flow_of(cls).inbox and flow_of(cls).writers[0] == owner]
    return (*(cls.type_name() for cls in owned),
            *(f"{kind}.*.{cls.type_name()}" for kind in SENDER_KINDS for cls in owned if kind in flow_of(cls).inbox))
