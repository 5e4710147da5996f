"""What every Corral process's telemetry has: a registry, readiness, and the endpoint serving them.

The services' (`metrics.ServiceTelemetry`) and the node agents' (`agent.AgentTelemetry`)
telemetry share this base (readiness hooks, endpoint start and stop, the scrape-time collector,
the STOPPING phase before the endpoint closes); each adds only its own families.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from corral import environment
from corral.telemetry import endpoint
from corral.telemetry.health import Backlog, Phase, Readiness


class Computed(Collector):
    """Families computed when a scrape renders them (from the folded view or the agent's nodes)."""

    def __init__(self, produce: Callable[[], Iterable[Metric]]) -> None:
        self._produce = produce

    def collect(self) -> Iterable[Metric]:
        return list(self._produce())


class ProcessTelemetry:
    """A registry with the process's CPU, memory and start time; readiness; `/metrics`,
    `/healthz` and `/readyz` on `CORRAL_METRICS_ADDR` (or the address given to `start`)."""

    def __init__(self, label: str, readiness: Readiness) -> None:
        self.label = label  # names the process in the endpoint's log line
        self.registry = CollectorRegistry(auto_describe=False)
        self.readiness = readiness
        self.endpoint: endpoint.Endpoint | None = None
        self.consumers: Sequence[Backlog] = ()
        ProcessCollector(registry=self.registry)

    # ---- the run loop's hooks --------------------------------------------------------------------
    def phase(self, phase: Phase) -> None:
        self.readiness.phase = phase

    def consuming(self, consumers: Sequence[Backlog]) -> None:
        self.consumers = consumers
        self.readiness.consumers = consumers
        self.readiness.phase = Phase.CONSUMING

    async def start(self, address: str | None = None) -> endpoint.Endpoint | None:
        where = address if address is not None else environment.get(endpoint.METRICS_ADDR_ENV)
        routes = dict(zip(endpoint.PATHS, (self.metrics, self.readiness.healthz, self.readiness.readyz),
                          strict=True))
        self.endpoint = await endpoint.start(where, routes, self.label)
        return self.endpoint

    async def stop(self) -> None:
        self.readiness.phase = Phase.STOPPING
        if self.endpoint is not None:
            await self.endpoint.close()
            self.endpoint = None

    async def metrics(self) -> tuple[int, str, bytes]:
        raise NotImplementedError
