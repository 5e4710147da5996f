"""The NATS JetStream bus: streams, deduplicated publishing, durable pull consumers with retry and
dead-lettering, and the outbox relay from the event store.

Why lazily: importing a submodule (`corral.bus.auth`, `corral.bus.naming`: what a CLI command that
never publishes needs) runs this package first. Importing every piece here would load nats-py,
the relay and the event store into each of them; instead each name below is imported on first
use (PEP 562 `__getattr__`), and type checkers read the imports under TYPE_CHECKING.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.bus.bus import DUPLICATE_WINDOW, Bus, Outgoing, Published, StreamMissing
    from corral.bus.consumer import RunningConsumer
    from corral.bus.delivery import Delivery, Handler, Poison, Retry
    from corral.bus.naming import Namespace
    from corral.bus.relay import OutboxRelay
    from corral.bus.unavailable import Unavailable, UnavailableBackoff, dependency_failure, is_unavailable

# submodule -> the names this package re-exports from it
_HOMES: dict[str, tuple[str, ...]] = {
    "bus": ("DUPLICATE_WINDOW", "Bus", "Outgoing", "Published", "StreamMissing"),
    "consumer": ("RunningConsumer",),
    "delivery": ("Delivery", "Handler", "Poison", "Retry"),
    "naming": ("Namespace",),
    "relay": ("OutboxRelay",),
    "unavailable": ("Unavailable", "UnavailableBackoff", "dependency_failure", "is_unavailable"),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"corral.bus.{module}"), name)
    globals()[name] = value
    return value
