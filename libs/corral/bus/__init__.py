"""The NATS JetStream bus: streams, deduplicated publishing, durable pull consumers with retry and
dead-lettering, and the outbox relay from the event store."""

from corral.bus.bus import DUPLICATE_WINDOW, Bus, Outgoing, Published, StreamMissing
from corral.bus.consumer import RunningConsumer
from corral.bus.delivery import Delivery, Handler, Poison, Retry
from corral.bus.naming import Namespace
from corral.bus.relay import OutboxRelay
from corral.bus.unavailable import Unavailable, UnavailableBackoff, is_unavailable

__all__ = [
    "DUPLICATE_WINDOW",
    "Bus",
    "Delivery",
    "Handler",
    "Namespace",
    "OutboxRelay",
    "Outgoing",
    "Poison",
    "Published",
    "Retry",
    "RunningConsumer",
    "StreamMissing",
    "Unavailable",
    "UnavailableBackoff",
    "is_unavailable",
]
