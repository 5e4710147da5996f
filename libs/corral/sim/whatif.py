"""What-if for a queue-tree change, and the evidence gate over it.

Why: a change of guarantees, ceilings or weights moves waiting time from one team to another, and
`corral apply` used to change the tree with no idea by how much. Corral has what it takes to know
before: the log holds the real workload, and the simulator runs the production core. Here the
recorded workload is replayed twice, under the current tree and under the proposed one, and each
queue's figures are put side by side (`corral apply FILE --what-if`). A criterion such as
`queue team-a p95_wait <= 2h` (`--require`) is then checked against the proposed tree's figures:
the evidence gate. Pure: the CLI reads the log and the files; nothing here touches a cluster.

Figures per queue (over the replayed jobs of that queue):
- `avg_wait`, `p95_wait`: seconds from submission to first start; a job that never started
  waits until the end of the replay.
- `gpu_hours`: GPU-hours held.
- `fair_share`: time-weighted mean ratio of the queue's GPUs to its fair share while contended
  (`corral.sim.metrics.fairness`; None when the queue never contended).
- `preemptions`: runs of the queue's jobs stopped by preemption.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from corral.contracts.events import GateCheck
from corral.contracts.queues import GATE_METRICS, Gate, QueueSpec, parse_gate
from corral.core import Cluster, QueueConfig
from corral.sim.api import SimResult, run_simulation
from corral.sim.metrics import percentile
from corral.sim.workload import Workload
from corral.translate import queue_from_spec

METRICS = GATE_METRICS
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt, "==": operator.eq,
}


@dataclass(frozen=True, slots=True)
class QueueOutcome:
    """One queue's figures in one replay (see the module docstring)."""

    queue: str
    jobs: int
    avg_wait: float
    p95_wait: float
    gpu_hours: float
    fair_share: float | None
    preemptions: int

    def figure(self, metric: str) -> float | None:
        value: float | None = getattr(self, metric)
        return value


@dataclass(frozen=True, slots=True)
class WhatIf:
    """The same recorded workload under the current (`before`) and the proposed (`after`) tree."""

    jobs: int
    before: dict[str, QueueOutcome]
    after: dict[str, QueueOutcome]

    def rows(self) -> list[dict[str, Any]]:
        """One row per queue: each metric before and after (None where a queue had no jobs)."""
        out = []
        for queue in sorted(set(self.before) | set(self.after)):
            row: dict[str, Any] = {"queue": queue}
            for side, figures in (("before", self.before), ("after", self.after)):
                outcome = figures.get(queue)
                for metric in METRICS:
                    row[f"{metric}_{side}"] = None if outcome is None else outcome.figure(metric)
            row["jobs"] = (self.after.get(queue) or self.before[queue]).jobs
            out.append(row)
        return out


@dataclass(frozen=True, slots=True)
class Criterion:
    """`queue Q METRIC OP VALUE[s|m|h|d]`: a bound the proposed tree's what-if must meet."""

    text: str
    queue: str
    metric: str
    op: str
    threshold: float

    def check(self, whatif: WhatIf) -> GateCheck:
        before = whatif.before.get(self.queue)
        after = whatif.after.get(self.queue)
        value = None if after is None else after.figure(self.metric)
        passed = value is not None and _OPS[self.op](value, self.threshold)
        return GateCheck(criterion=self.text, queue=self.queue, metric=self.metric, op=self.op,
                         threshold=self.threshold, before=None if before is None else before.figure(self.metric),
                         after=value, passed=passed)


def parse_criterion(text: str) -> Criterion:
    """A criterion from `--require` or a queues file's `gates`; ValueError names what is wrong."""
    return criterion_of(parse_gate(text))


def criterion_of(gate: Gate) -> Criterion:
    return Criterion(gate.text, gate.queue, gate.metric, gate.op, gate.threshold)


def queue_configs(specs: Sequence[QueueSpec]) -> tuple[QueueConfig, ...]:
    return tuple(queue_from_spec(q) for q in sorted(specs, key=lambda q: (q.name.count("/"), q.name)))


def outcomes(result: SimResult) -> dict[str, QueueOutcome]:
    """Each queue's figures in one replay."""
    end = max((p.end for r in result.records for p in r.placements), default=0.0)
    end = max(end, max((r.end or 0.0 for r in result.records), default=0.0))
    ratios = {q.name: q.mean_fair_share_ratio for q in result.summary.queues}
    out = {}
    for queue in sorted({r.queue for r in result.records}):
        mine = [r for r in result.records if r.queue == queue]
        waits = sorted((r.start if r.start is not None else max(end, r.submit)) - r.submit for r in mine)
        held = sum((p.end - p.start) * p.gpu_count for r in mine for p in r.placements)
        out[queue] = QueueOutcome(
            queue=queue, jobs=len(mine), avg_wait=sum(waits) / len(waits), p95_wait=percentile(waits, 95),
            gpu_hours=held / 3600.0, fair_share=ratios.get(queue), preemptions=sum(r.preemptions for r in mine))
    return out


def what_if(workload: Workload | str, cluster: Cluster | str, current: Sequence[QueueSpec],
            proposed: Sequence[QueueSpec], *, seed: int = 0, policy: str = "corral") -> WhatIf:
    """Replay `workload` on `cluster` under the current and the proposed tree, both under `policy`
    (the cluster's: `ClusterView.policy`)."""
    before = run_simulation(workload, cluster, policy=policy, queues=queue_configs(current), seed=seed)
    after = run_simulation(before.workload, cluster, policy=policy, queues=queue_configs(proposed), seed=seed)
    return WhatIf(jobs=len(before.records), before=outcomes(before), after=outcomes(after))


def finite(value: float | None) -> float | None:
    """JSON-safe: NaN and infinities become None."""
    return None if value is None or not math.isfinite(value) else value
