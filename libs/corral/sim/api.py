"""The simulator's entry points: `run_simulation` and `compare`, behind `corral sim` (`corral.cli.sim`).

Each accepts the inputs the way people give them (a trace spec like `philly:FILE`, a cluster
shorthand like `64x8:H100` or a file, an optional queues file) or as ready values for tests.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from corral.core import Cluster, QueueConfig, SchedulerConfig
from corral.sim.engine import EngineStats, FailureModel, Scheduler, Simulator
from corral.sim.importers import load_workload
from corral.sim.inputs import complete_queues, equal_share_queues, load_cluster, load_queues
from corral.sim.metrics import Summary, summarize
from corral.sim.records import JobRecord
from corral.sim.workload import Workload

DEFAULT_POLICIES = ("corral", "fifo", "priority", "backfill", "las", "fair-las")


@dataclass(slots=True)
class SimResult:
    """One policy's replay of one workload: the exact schedule, its summary and how the run went."""

    policy: str
    seed: int
    workload: Workload
    cluster: Cluster
    cluster_description: str
    queues: tuple[QueueConfig, ...]
    records: list[JobRecord]
    summary: Summary
    stats: EngineStats
    final_reasons: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def schedule_hash(self) -> str:
        """sha256 of every record's start, end, preemptions and placements (nodes and GPUs): the
        schedule's fingerprint, to compare two builds' or two pipelines' schedules."""
        h = hashlib.sha256()
        for r in self.records:
            spans = [(p.start, p.end, [(k.node, list(k.gpus)) for k in p.ranks]) for p in r.placements]
            h.update(repr((r.id, r.start, r.end, r.preemptions, spans)).encode())
        return h.hexdigest()

    @property
    def jobs_per_wall_second(self) -> float:
        return len(self.records) / self.stats.wall_seconds if self.stats.wall_seconds else 0.0


def run_simulation(
    workload: Workload | str | Path,
    cluster: Cluster | str | Path,
    *,
    policy: str = "corral",
    config: SchedulerConfig | None = None,
    queues: Sequence[QueueConfig] | str | Path | None = None,
    seed: int = 0,
    failures: FailureModel | None = None,
    limit: int | None = None,
    scheduler: Scheduler | None = None,
    progress: Callable[[float, EngineStats], None] | None = None,
    pipeline: str = "cycle",
) -> SimResult:
    """Replay `workload` on `cluster` under `policy` (or an explicit `config`).

    workload: a Workload, `philly:FILE`, `openb:FILE` or a JSONL path; `limit` keeps the first N jobs.
    cluster: a Cluster, a cluster file (YAML/JSON as `corral up`) or a shorthand like `64x8:H100`.
    queues: QueueConfigs or a queues file; None gives every workload queue an equal guarantee.
    pipeline: "cycle" (the single combined cycle) or "services" (quota, placement and preemption
    one after the other, as the live services decide; see `corral.sim.engine`).
    """
    loaded = workload if isinstance(workload, Workload) else load_workload(workload)
    if limit is not None:
        loaded = loaded.head(limit)
    built = load_cluster(cluster)
    description = str(cluster) if not isinstance(cluster, Cluster) else f"{len(built.nodes)} nodes"
    notes: list[str] = []
    if queues is None:
        chosen = equal_share_queues(loaded.queues, built.total_gpus)
        if chosen:
            notes.append(
                f"no queues file: each of the {len(chosen)} queues is guaranteed "
                f"{chosen[0].guaranteed_gpus} GPUs (equal share), weight 1, no ceiling"
            )
    else:
        configured = load_queues(queues) if isinstance(queues, str | Path) else tuple(queues)
        chosen = complete_queues(configured, loaded.queues)
    if pipeline != "cycle":
        notes.append(f"pipeline {pipeline}: quota, placement and preemption decide one after the other")
    if failures is not None:
        notes.append(
            f"node failures: mean time between failures {failures.mtbf_hours} h per node, "
            f"repair {failures.repair_hours} h, seed {seed}"
        )
    chosen_config = config or SchedulerConfig.named(policy)
    outcome = Simulator(
        loaded, built, chosen, chosen_config, seed=seed, failures=failures, scheduler=scheduler, progress=progress,
        pipeline=pipeline,
    ).run()
    summary = summarize(outcome.records, built, chosen)
    return SimResult(
        policy,
        seed,
        loaded,
        built,
        description,
        chosen,
        outcome.records,
        summary,
        outcome.stats,
        outcome.final_reasons,
        tuple(notes),
    )


def compare(
    workload: Workload | str | Path,
    cluster: Cluster | str | Path,
    policies: Sequence[str] = DEFAULT_POLICIES,
    *,
    queues: Sequence[QueueConfig] | str | Path | None = None,
    seed: int = 0,
    failures: FailureModel | None = None,
    limit: int | None = None,
    progress: Callable[[str, float, EngineStats], None] | None = None,
    pipeline: str = "cycle",
) -> list[SimResult]:
    """The same workload, cluster, queues and seed under each policy, in the order given.

    `progress(policy, simulated_now, stats)` is called now and then during each long replay.
    """
    loaded = workload if isinstance(workload, Workload) else load_workload(workload)
    return [
        run_simulation(loaded, cluster, policy=p, queues=queues, seed=seed, failures=failures, limit=limit,
                       progress=None if progress is None else _for_policy(progress, p), pipeline=pipeline)
        for p in policies
    ]


def _for_policy(
    progress: Callable[[str, float, EngineStats], None], policy: str
) -> Callable[[float, EngineStats], None]:
    return lambda now, stats: progress(policy, now, stats)
