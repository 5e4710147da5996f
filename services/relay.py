"""The outbox relay of a service process: publish the log whenever this process holds the relay lease.

Why: the log must reach the bus while any service process lives, and exactly one
process should publish it at a time. Every process runs this task; the relay lease (a
`corral.services.lease.Lease`) picks the publisher, and a survivor takes over when it dies.

Which process relays matters under load: the relay shares its event loop with the service, and
behind a service busy deciding (preemption's victim search, quota's fair share) every event
reached the bus seconds late. So at start a process competes for the lease only after its
service's `relay_wait()`: an idle placement standby at once, admission soon, the deciding
services later. Once started, any process takes over a free lease (failover stays quick). The
loop is `corral.services.leased_task`'s, shared with the CLI's projector.
"""

from __future__ import annotations

from corral.bus import Bus, OutboxRelay, dependency_failure
from corral.bus.node_work import NodeWorkRouter
from corral.bus.relay import event_headers
from corral.contracts.routes import relayed_types
from corral.contracts.subjects import Subjects
from corral.eventstore import EventStore
from corral.services.base import Service
from corral.services.lease import Lease
from corral.services.leased_task import run_while_leased
from corral.services.settings import Settings


async def relay_forever(store: EventStore, bus: Bus, settings: Settings, service: Service) -> None:
    """Run the outbox relay whenever this process holds the relay lease (see the module docstring).
    A failure other than an unavailable NATS or Postgres ends the process (a bug must be seen)."""
    relay = service_relay(store, bus, settings.namespace)
    await run_while_leased(Lease(settings.postgres_dsn, f"corral:{settings.namespace}:relay"), service, relay,
                           name="relay lease", doing="relaying the log",
                           fatal=lambda exc: not dependency_failure(exc))


def service_relay(store: EventStore, bus: Bus, namespace: str) -> OutboxRelay:
    """The relay as a service process runs it: node work, only the types some process is sent
    (`relayed_types`), its position saved a few times a second."""
    router = NodeWorkRouter(store, Subjects(namespace), event_headers)
    return OutboxRelay(store, bus, lambda e: f"{namespace}.events.{e.type}", name="relay", linger=0.005,
                       node_work=router.work, save_every=0.2, types=relayed_types())
