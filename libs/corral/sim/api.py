"""The simulator's entry points: `run_simulation`, `compare`, and `sim_main` behind `corral sim`.

Each accepts the inputs the way people give them (a trace spec like `philly:FILE`, a cluster
shorthand like `64x8:H100` or a file, an optional queues file) or as ready values for tests.
"""

from __future__ import annotations

import argparse
import sys
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

DEFAULT_POLICIES = ("corral", "fifo", "priority", "backfill", "las")


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
) -> SimResult:
    """Replay `workload` on `cluster` under `policy` (or an explicit `config`).

    workload: a Workload, `philly:FILE`, `openb:FILE` or a JSONL path; `limit` keeps the first N jobs.
    cluster: a Cluster, a cluster file (YAML/JSON as `corral up`) or a shorthand like `64x8:H100`.
    queues: QueueConfigs or a queues file; None gives every workload queue an equal guarantee.
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
    if failures is not None:
        notes.append(
            f"node failures: mean time between failures {failures.mtbf_hours} h per node, "
            f"repair {failures.repair_hours} h, seed {seed}"
        )
    chosen_config = config or SchedulerConfig.named(policy)
    outcome = Simulator(
        loaded, built, chosen, chosen_config, seed=seed, failures=failures, scheduler=scheduler, progress=progress
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
) -> list[SimResult]:
    """The same workload, cluster, queues and seed under each policy, in the order given."""
    loaded = workload if isinstance(workload, Workload) else load_workload(workload)
    return [
        run_simulation(loaded, cluster, policy=p, queues=queues, seed=seed, failures=failures, limit=limit)
        for p in policies
    ]


def build_parser(prog: str = "corral sim") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Replay a workload through Corral's scheduling core.")
    parser.add_argument("--trace", required=True, help="philly:FILE, openb:FILE or a Corral JSONL workload")
    parser.add_argument("--cluster", required=True, help="cluster file, or shorthand NODESxGPUS:MODEL, e.g. 64x8:H100")
    parser.add_argument("--queues", help="queues file (default: equal share for every workload queue)")
    parser.add_argument(
        "--policy",
        default="corral",
        help=f"one policy, or several comma-separated to compare ({', '.join(DEFAULT_POLICIES)})",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, help="replay only the first N jobs")
    parser.add_argument("--failures-mtbf-hours", type=float, help="enable seeded node failures")
    parser.add_argument("--repair-hours", type=float, default=4.0)
    parser.add_argument("--json", dest="json_path", help="write summary and the exact schedule here")
    parser.add_argument("--plot", dest="plot_dir", help="write PNG plots into this folder")
    return parser


def sim_main(argv: Sequence[str] | None = None, *, compare_all: bool = False) -> int:
    """`corral sim [...]`; with `compare_all=True` (`corral sim compare`) the default is every policy."""
    from corral.sim.output import render_comparison, render_result, write_comparison_json, write_json

    args = build_parser("corral sim compare" if compare_all else "corral sim").parse_args(argv)
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    if compare_all and args.policy == "corral":
        policies = list(DEFAULT_POLICIES)
    failures = None
    if args.failures_mtbf_hours:
        failures = FailureModel(args.failures_mtbf_hours, args.repair_hours)
    try:
        results = compare(
            args.trace,
            args.cluster,
            policies,
            queues=args.queues,
            seed=args.seed,
            failures=failures,
            limit=args.limit,
        )
    except ValueError as error:  # bad input: the message names the field and the fix
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(render_result(results[0]) if len(results) == 1 else render_comparison(results))
    if args.json_path:
        if len(results) == 1:
            write_json(results[0], args.json_path)
        else:
            write_comparison_json(results, args.json_path)
    if args.plot_dir:
        from corral.sim.plot import write_plots

        for path in write_plots(results, args.plot_dir):
            print(f"wrote {path}")
    return 0
