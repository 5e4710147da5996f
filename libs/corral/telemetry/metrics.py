"""A service's `/metrics`: what its folded view says, what its own work costs, and its lags.

Three kinds of figures, all in one Prometheus registry per service process:
- the cluster as the view holds it, computed at scrape time (`families`), and the log's counters
  and wait histograms counted as events are folded (`logstats`): each family has one owning
  service (`OWNED`), so a sum over every scraped process counts it once;
- this process's own work, measured where it happens: event-store append latency (every append,
  `EventStore.observe_appends`), scheduling cycle duration and decisions per cycle (the run loop's
  reconciles: events appended during one), and the process's CPU, memory and start time;
- lags, asked when scraped: this process's durable consumers' backlogs (JetStream's count), the
  outbox relay's (events recorded, not yet published, and the age of the oldest), the DLQ's size.

`ServiceTelemetry.attach(service)` wires it to a service (`corral.services.run_loop.run_service`
calls it; the hooks there are one line each), `start()` opens the endpoint (`endpoint`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from typing import Any, Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from corral.contracts.envelope import Event
from corral.projection import ClusterView
from corral.telemetry.families import gpu_families, heartbeat_families, job_families, queue_families
from corral.telemetry.health import Phase, Readiness
from corral.telemetry.logstats import LogStatistics
from corral.telemetry.process import Computed, ProcessTelemetry

log = logging.getLogger("corral.telemetry")

#: The outbox relay's name (`corral.services.relay.relay_forever`).
RELAY = "relay"
#: Which service reports which families of the log (`LogStatistics` attribute names).
OWNED_LOG_FAMILIES: dict[str, tuple[str, ...]] = {
    "admission": ("admission",),
    "quota": ("quota_reserved", "wait_quota"),
    "placement": ("wait_placement", "wait_running", "requeues", "failures", "ended", "lost"),
    "preemption": ("preemptions",),
}
CYCLE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
DECISION_BUCKETS = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0)
APPEND_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ObservedService(Protocol):
    """What telemetry reads of a service (`corral.services.base.Service`)."""

    view: ClusterView
    store: Any
    bus: Any
    standby: bool

    @property
    def name(self) -> str: ...

    def folded(self, event: Event) -> None: ...


class _Probed(Collector):
    """Families computed asynchronously just before a scrape renders (lags asked over the network)."""

    def __init__(self) -> None:
        self.families: list[Metric] = []

    def collect(self) -> Iterable[Metric]:
        return list(self.families)


class ServiceTelemetry(ProcessTelemetry):
    """One service process's registry, readiness and endpoint."""

    def __init__(self, service: ObservedService, lease: str | None = None) -> None:
        disable_created_metrics()  # no `_created` series beside each counter and histogram (noise)
        super().__init__(service.name, Readiness(connected=lambda: bool(service.bus.nc.is_connected), lease=lease))
        self.service = service
        self.stats = LogStatistics(CollectorRegistry(auto_describe=False))
        for attribute in OWNED_LOG_FAMILIES.get(service.name, ()):
            self.registry.register(getattr(self.stats, attribute))
        self.append_seconds = Histogram("corral_eventstore_append_duration_seconds", "Seconds an append to the "
                                        "event store took (one transaction).", ["service"], buckets=APPEND_BUCKETS,
                                        registry=self.registry).labels(service.name)
        self.cycle_seconds = Histogram("corral_scheduling_cycle_duration_seconds", "Seconds a reconcile (decide "
                                       "from the view, append the decisions) took.", ["service"],
                                       buckets=CYCLE_BUCKETS, registry=self.registry).labels(service.name)
        self.cycle_decisions = Histogram("corral_scheduling_cycle_decisions", "Events a reconcile appended (its "
                                         "decisions).", ["service"], buckets=DECISION_BUCKETS,
                                         registry=self.registry).labels(service.name)
        self.registry.register(Computed(self._view_families))
        self._probed = _Probed()
        self.registry.register(self._probed)
        self._appended_in_cycle = 0
        self._cycle_started: float | None = None

    @classmethod
    def attach(cls, service: ObservedService, lease: str | None = None) -> ServiceTelemetry:
        """Telemetry for `service`: its appends timed, its folded events counted."""
        telemetry = cls(service, lease)
        service.store.observe_appends(telemetry._appended)
        folded = service.folded

        def folded_and_counted(event: Event) -> None:
            folded(event)
            telemetry.stats.observe(service.view, event)

        # Every path that folds an event calls `folded` (see Service): count there, once per event.
        setattr(service, "folded", folded_and_counted)  # noqa: B010 (an instance attribute over the method)
        return telemetry

    # ---- the run loop's hooks (and `ProcessTelemetry`'s) --------------------------------------------
    def cycle_started(self) -> None:
        self._cycle_started, self._appended_in_cycle = time.perf_counter(), 0

    def cycle_ended(self) -> None:
        if self._cycle_started is not None:
            self.cycle_seconds.observe(time.perf_counter() - self._cycle_started)
            self.cycle_decisions.observe(self._appended_in_cycle)
            self._cycle_started = None

    def _appended(self, seconds: float, events: int) -> None:
        self.append_seconds.observe(seconds)
        if self._cycle_started is not None:
            self._appended_in_cycle += events

    # ---- the endpoint ----------------------------------------------------------------------------
    async def metrics(self) -> tuple[int, str, bytes]:
        self._probed.families = await self._probe()
        return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)

    def _view_families(self) -> Iterable[Metric]:
        view, name = self.service.view, self.service.name
        out: list[Metric] = []
        ready = GaugeMetricFamily("corral_service_phase", "1 for the phase the service is in (starting, "
                                  "standby, rebuilding, consuming, stopping).", labels=["service", "phase"])
        for phase in Phase:
            ready.add_metric([name, phase.value], 1.0 if self.readiness.phase is phase else 0.0)
        position = GaugeMetricFamily("corral_service_folded_position", "The last log position the service "
                                     "folded at its rebuild.", labels=["service"])
        position.add_metric([name], view.position)
        out += [ready, position]
        if self.readiness.phase is not Phase.CONSUMING:
            return out  # a standby or a rebuilding service knows nothing to report yet
        if name == "placement":
            out += gpu_families(view) + job_families(view)
            heartbeats = getattr(self.service, "heartbeats", {})
            since = getattr(self.service, "started_at", time.time())
            out += heartbeat_families(view, heartbeats, time.time(), since)
        elif name == "quota":
            out += queue_families(view)
        return out

    async def _probe(self) -> list[Metric]:
        """The lags, asked now (each on its own: one that does not answer leaves the others)."""
        name = self.service.name
        backlogs, relay, dlq = await asyncio.gather(
            self.readiness.backlogs(), _quietly(self.service.store.relay_backlog(RELAY)),
            _quietly(self._dlq_messages()))
        pending = GaugeMetricFamily("corral_consumer_pending_messages", "Messages of the durable consumer not "
                                    "yet delivered (its lag).", labels=["service", "durable"])
        unacked = GaugeMetricFamily("corral_consumer_ack_pending_messages", "Messages delivered to the durable "
                                    "consumer and not yet acknowledged.", labels=["service", "durable"])
        for durable, backlog in sorted(backlogs.items()):
            if backlog is not None:
                pending.add_metric([name, durable], backlog[0])
                unacked.add_metric([name, durable], backlog[1])
        out: list[Metric] = [pending, unacked]
        if relay is not None:
            head, relayed, oldest = relay
            events = GaugeMetricFamily("corral_relay_lag_events", "Events in the log the outbox relay has not "
                                       "published yet.")
            events.add_metric([], max(0, head - relayed))
            seconds = GaugeMetricFamily("corral_relay_lag_seconds", "Age of the oldest event the outbox relay "
                                        "has not published (0 when caught up).")
            seconds.add_metric([], max(0.0, time.time() - oldest.timestamp()) if oldest is not None else 0.0)
            head_family = GaugeMetricFamily("corral_eventstore_head_position", "The log's last position.")
            head_family.add_metric([], head)
            out += [events, seconds, head_family]
        if dlq is not None:
            dead = GaugeMetricFamily("corral_dlq_messages", "Messages in the dead-letter stream (corral dlq list).")
            dead.add_metric([], dlq)
            out.append(dead)
        return out

    async def _dlq_messages(self) -> int:
        bus = self.service.bus
        info = await bus.js.stream_info(bus.names.dead_letter_stream)
        return int(info.state.messages)


async def _quietly(awaitable: Any) -> Any:
    """The answer, or None when it fails or takes over 2 s (a scrape never hangs on a lag)."""
    with contextlib.suppress(Exception):
        return await asyncio.wait_for(awaitable, 2.0)
    return None
