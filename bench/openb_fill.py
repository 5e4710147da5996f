"""The ATC'23 (FGD) fill-the-cluster placement experiment, on whole GPUs.

Setup, as in Weng et al. "Beware of Fragmentation" (USENIX ATC'23): the OpenB cluster (1,213 nodes,
6,212 GPUs), tasks drawn at random from the trace and placed one by one as they arrive, no
departures, until the GPUs requested reach 130% of capacity; a task that fits nowhere is dropped.
The figure is the allocation ratio: GPUs allocated / cluster GPUs at the end.

Differences from the paper, stated in the output: Corral allocates whole GPUs, so a GPU-sharing
task (gpu_milli < 1000) asks one whole GPU; CPU and memory are not modelled; each node is one
NVLink domain (the trace does not say). All three placers see the same task sequence per seed:
- corral: `corral.core.placement.find_placement` (tightest, then best fit by NVLink domain/node);
- best-fit: the feasible node with the fewest free GPUs left after placing (ties: node order);
- random: a uniformly random feasible node (seeded).

Run: .venv/bin/python bench/openb_fill.py [--seeds 10] [--tasks default|multigpu50]
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from machine_probe import probe_line

from corral.core import Cluster, Gpu, Job, Node, Placement, Topology, TopologyLevel
from corral.core.gpuset import FreeGpus, mask_of
from corral.core.placement import find_placement
from corral.sim.importers.openb import OpenbTask, read_tasks

TRACES = Path(__file__).resolve().parent.parent.parent / "shared" / "traces"
MEMORY_GIB = {"P100": 16, "T4": 16, "V100M16": 16, "V100M32": 32, "A10": 24}
FILL = 1.30


def openb_cluster(path: Path) -> Cluster:
    """The OpenB nodes: one NVLink domain per node, racks of 8 nodes in file order (racks unused:
    every task fits one node)."""
    nodes = []
    with path.open(newline="") as handle:
        for i, row in enumerate(csv.DictReader(handle)):
            model = row["model"]
            gpus = tuple(Gpu(g, model, MEMORY_GIB.get(model, 16), 0) for g in range(int(row["gpu"])))
            nodes.append(Node(row["sn"], gpus, f"rack-{i // 8}", "zone-0"))
    return Cluster(tuple(nodes))


def draw(tasks: Sequence[OpenbTask], capacity: int, rng: random.Random) -> list[OpenbTask]:
    """Tasks drawn with replacement until the GPUs requested reach FILL x capacity."""
    out: list[OpenbTask] = []
    asked = 0
    while asked < FILL * capacity:
        task = tasks[rng.randrange(len(tasks))]
        out.append(task)
        asked += task.gpus
    return out


Placer = Callable[[FreeGpus, Job, random.Random], Placement | None]


def corral_placer(cluster: Cluster) -> Placer:
    def place(free: FreeGpus, job: Job, rng: random.Random) -> Placement | None:
        found = find_placement(cluster, free, job)
        return found if isinstance(found, Placement) else None

    return place


def _feasible(free: FreeGpus, job: Job) -> list[int]:
    _, match = free.match_masks(job.gpu)
    need = job.gpus_per_replica
    return [
        i
        for i in range(len(free.names))
        if free.eligible[i] and (free.free[i] & match[i]).bit_count() >= need
    ]


def _on_node(free: FreeGpus, job: Job, i: int) -> Placement:
    from corral.core import RankPlacement
    from corral.core.gpuset import indices_of

    _, match = free.match_masks(job.gpu)
    gpus = indices_of(free.free[i] & match[i])[: job.gpus_per_replica]
    return Placement((RankPlacement(0, free.names[i], gpus),))


def best_fit(free: FreeGpus, job: Job, rng: random.Random) -> Placement | None:
    nodes = _feasible(free, job)
    if not nodes:
        return None
    i = min(nodes, key=lambda n: (free.free[n].bit_count(), n))
    return _on_node(free, job, i)


def random_fit(free: FreeGpus, job: Job, rng: random.Random) -> Placement | None:
    nodes = _feasible(free, job)
    return _on_node(free, job, nodes[rng.randrange(len(nodes))]) if nodes else None


def fill(
    cluster: Cluster, sequence: Sequence[OpenbTask], placer: Placer, seed: int
) -> tuple[float, float, float, float]:
    """(allocation ratio at the end, when the first task was refused, when the requests reached
    100% of capacity, seconds spent placing). The middle figures show fragmentation before the
    overfill's small tasks plug the holes."""
    free = FreeGpus(cluster)
    rng = random.Random(seed)
    allocated = 0
    first_refusal: float | None = None
    at_full: float | None = None
    asked = 0
    spent = 0.0
    for n, task in enumerate(sequence):
        asked += task.gpus
        if at_full is None and asked > cluster.total_gpus:
            at_full = allocated / cluster.total_gpus
        job = Job(f"t{n}", "openb", 1, task.gpus, float(n), topology=Topology(replica=TopologyLevel.NODE))
        started = time.perf_counter()
        placement = placer(free, job, rng)
        spent += time.perf_counter() - started
        if placement is None:
            if first_refusal is None:
                first_refusal = allocated / cluster.total_gpus
            continue
        for rank in placement.ranks:
            free.take(free.index_of[rank.node], mask_of(rank.gpus))
        allocated += placement.gpu_count
    end = allocated / cluster.total_gpus
    return (end, end if first_refusal is None else first_refusal, end if at_full is None else at_full, spent)


def machine() -> str:
    return (
        f"{platform.node()} | {platform.processor() or platform.machine()} | {os.cpu_count()} cores | "
        f"Python {platform.python_version()} | {platform.platform()}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--tasks", choices=("default", "multigpu50"), default="default")
    parser.add_argument("--traces", type=Path, default=TRACES)
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run (seconds) checking the script end to end (the test suite)")
    args = parser.parse_args(argv)
    print(probe_line(), flush=True)
    if args.smoke:  # the test suite's size: runs end to end in seconds
        args.seeds = 1
    nodes_csv = args.traces / "openb_node_list_gpu_node.csv"
    tasks_csv = args.traces / f"openb_pod_list_{args.tasks}.csv"
    if not nodes_csv.is_file() or not tasks_csv.is_file():
        print(f"traces not found under {args.traces}; pass --traces DIR", file=sys.stderr)
        return 2
    cluster = openb_cluster(nodes_csv)
    tasks = read_tasks(tasks_csv)
    placers: dict[str, Placer] = {
        "corral": corral_placer(cluster),
        "best-fit": best_fit,
        "random": random_fit,
    }
    ratios: dict[str, list[float]] = {name: [] for name in placers}
    refusals: dict[str, list[float]] = {name: [] for name in placers}
    at_full: dict[str, list[float]] = {name: [] for name in placers}
    timing: dict[str, float] = {name: 0.0 for name in placers}
    placed_tasks = 0
    for seed in range(args.seeds):
        sequence = draw(tasks, cluster.total_gpus, random.Random(seed))
        placed_tasks += len(sequence)
        for name, placer in placers.items():
            ratio, refused_at, full, spent = fill(cluster, sequence, placer, seed)
            at_full[name].append(full)
            ratios[name].append(ratio)
            refusals[name].append(refused_at)
            timing[name] += spent
    sharing = sum(1 for t in tasks if t.gpu_milli < 1000)
    print(f"OpenB fill to {FILL:.0%} of capacity, no departures, {args.seeds} seeds")
    print(f"cluster: {len(cluster.nodes)} nodes, {cluster.total_gpus} GPUs (openb_node_list_gpu_node.csv)")
    print(
        f"tasks: {tasks_csv.name}, {len(tasks)} GPU tasks ({sharing} GPU-sharing tasks count as one "
        "whole GPU; CPU/memory not modelled)"
    )
    print(f"machine: {machine()}")
    print(
        f"{'placer':<10} {'mean alloc':>10} {'min':>7} {'max':>7} {'1st refusal at':>15} "
        f"{'at 100% asked':>14} {'us/task':>8}"
    )
    for name in placers:
        values = ratios[name]
        per_task = timing[name] / placed_tasks * 1e6
        print(
            f"{name:<10} {statistics.mean(values):>10.2%} {min(values):>7.2%} {max(values):>7.2%} "
            f"{statistics.mean(refusals[name]):>15.2%} {statistics.mean(at_full[name]):>14.2%} "
            f"{per_task:>8.1f}"
        )
    print("paper (GPU sharing, fractional GPUs): best-fit ~93%, random ~87.5%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
