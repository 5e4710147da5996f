"""A node-agent process's `/metrics`, `/healthz` and `/readyz` (one endpoint for all the nodes it runs).

Ready once it has read the past job specs, adopted the gangs its previous process left running
and registered its nodes (before, it would refuse or misjudge reservations), while NATS is
connected and its durable consumer is caught up. Its figures: the nodes it runs with their GPUs
and running jobs, the log position it has handled (what its heartbeats tell placement), its
consumer's backlog, and the process's CPU, memory and start time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from corral.telemetry.health import Phase, Readiness
from corral.telemetry.process import Computed, ProcessTelemetry


class AgentTelemetry(ProcessTelemetry):
    """`agents`: node name -> its agent (`inventory`, `supervisor.running_jobs()`); `handled`: the
    position the process has handled up to (None before it knows)."""

    def __init__(self, agents: Mapping[str, Any], handled: Callable[[], int | None],
                 connected: Callable[[], bool]) -> None:
        super().__init__("node agent", Readiness(connected=connected))
        self.agents = agents
        self.handled = handled
        self._pending: dict[str, tuple[int, int] | None] = {}
        self.registry.register(Computed(self._families))
        self.started_at = time.time()

    async def metrics(self) -> tuple[int, str, bytes]:
        self._pending = await self.readiness.backlogs()
        return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)

    def _families(self) -> Iterable[Metric]:
        gpus = GaugeMetricFamily("corral_node_agent_gpus", "GPUs of each node this agent process runs.",
                                 labels=["node", "model"])
        running = GaugeMetricFamily("corral_node_agent_running_jobs", "Jobs with processes (or timers) running on "
                                    "the node, as its heartbeats report them.", labels=["node"])
        for name in sorted(self.agents):
            agent = self.agents[name]
            models: dict[str, int] = {}
            for gpu in agent.inventory.gpus:
                models[gpu.model] = models.get(gpu.model, 0) + 1
            for model, n in sorted(models.items()):
                gpus.add_metric([name, model], n)
            running.add_metric([name], len(agent.supervisor.running_jobs()))
        handled = GaugeMetricFamily("corral_node_agent_handled_position", "The log position up to which this "
                                    "agent process has handled every event it consumes.")
        position = self.handled()
        if position is not None:
            handled.add_metric([], position)
        pending = GaugeMetricFamily("corral_consumer_pending_messages", "Messages of the durable consumer not yet "
                                    "delivered (its lag).", labels=["service", "durable"])
        for durable, backlog in sorted(self._pending.items()):
            if backlog is not None:
                pending.add_metric(["node-agent", durable], backlog[0])
        phase = GaugeMetricFamily("corral_service_phase", "1 for the phase the process is in.",
                                  labels=["service", "phase"])
        for p in Phase:
            phase.add_metric(["node-agent", p.value], 1.0 if self.readiness.phase is p else 0.0)
        return [gpus, running, handled, pending, phase]
