"""Benchmark one scheduling cycle of corral.core at the issue's scale.

1,000 nodes x 8 GPUs (8,000 GPUs, 125 racks of 8 nodes), 5,000 pending jobs of mixed gang sizes
(1 to 64 GPUs) across a few queues, some with topology constraints and runtime estimates.
Prints decisions per second, placements per second, the p50/p99 time to decide one job, and the
machine it ran on. Targets: >= 2,000 placement decisions/s on one core, cycle < 5 s.

    .venv/bin/python bench/core.py [--jobs 5000] [--nodes 1000] [--seed 7] [--repeat 3] [--profile]

`--scaling`: the same cycle (5,000 waiting) at 512, 4,096 and 16,384 GPUs (64, 512, 2,048 nodes;
racks of 64 nodes, 512 GPUs: an InfiniBand pod) side by side, with the time to decide one gang of
64 x 8 GPUs that must fit in one rack, each size's cluster empty and its 5,000 jobs waiting.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import platform
import pstats
import random
import statistics
import sys
import time

from machine_probe import probe_line

from corral.core import (
    Cluster,
    Job,
    PendingJob,
    Place,
    Placement,
    Preempt,
    QueueConfig,
    RankPlacement,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    Topology,
    TopologyLevel,
)
from corral.core.cycle import Cycle

SHAPES = [  # (replicas, gpus_per_replica, weight)
    (1, 1, 30),
    (1, 2, 10),
    (1, 4, 10),
    (1, 8, 12),
    (2, 8, 8),
    (4, 8, 6),
    (8, 8, 3),
    (8, 1, 5),
    (16, 1, 4),
    (4, 4, 5),
    (32, 2, 2),
]


def workload(jobs: int, seed: int) -> tuple[tuple[QueueConfig, ...], tuple[PendingJob, ...]]:
    rng = random.Random(seed)
    queues = (
        QueueConfig("research", guaranteed_gpus=3000, weight=2.0),
        QueueConfig("research/nlp", guaranteed_gpus=1500),
        QueueConfig("research/vision", guaranteed_gpus=1000, lend_limit=500),
        QueueConfig("prod", guaranteed_gpus=4000, max_gpus=7000),
        QueueConfig("batch", guaranteed_gpus=1000, max_gpus=6000, weight=0.5),
    )
    leaf = ["research/nlp", "research/vision", "research", "prod", "batch"]
    shapes = [(r, g) for r, g, _ in SHAPES]
    weights = [w for _, _, w in SHAPES]
    pending = []
    for n in range(jobs):
        r, g = rng.choices(shapes, weights)[0]
        topo = Topology()
        x = rng.random()
        if r > 1 and g == 8 and x < 0.4:
            topo = Topology(gang=TopologyLevel.RACK)
        elif r * g <= 8 and x < 0.3:
            topo = Topology(gang=TopologyLevel.NVLINK)
        elif g >= 2 and x < 0.5:
            topo = Topology(replica=TopologyLevel.NVLINK, prefer=TopologyLevel.RACK)
        est = rng.choice([None, 600.0, 3600.0, 4 * 3600.0])
        job = Job(
            f"j{n:05d}",
            rng.choice(leaf),
            r,
            g,
            submit_time=float(n),
            priority=rng.choice([0, 0, 0, 100, 1000]),
            topology=topo,
            estimated_runtime_seconds=est,
        )
        pending.append(PendingJob(job))
    return queues, tuple(pending)


def fragmented(cluster: Cluster, seed: int, busy: float) -> tuple[RunningJob, ...]:
    """Running 1-4 GPU jobs scattered over the cluster until `busy` of it is used (fragmentation)."""
    rng = random.Random(seed + 1)
    leaf = ["research/nlp", "research/vision", "prod", "batch"]
    running = []
    target = int(busy * cluster.total_gpus)
    used = 0
    for n, node in enumerate(cluster.nodes):
        free = list(range(8))
        rng.shuffle(free)
        want = rng.randint(0, 8) if rng.random() < busy * 1.6 else 0
        want = min(want, target - used)
        k = 0
        while want - k > 0:
            g = min(rng.choice([1, 1, 2, 4]), want - k)
            gpus = tuple(sorted(free[k : k + g]))
            k += g
            job = Job(
                f"r{n:04d}-{k}",
                rng.choice(leaf),
                1,
                g,
                submit_time=-1000.0,
                priority=rng.choice([0, 100]),
                estimated_runtime_seconds=rng.choice([None, 1800.0, 7200.0]),
            )
            running.append(
                RunningJob(
                    job,
                    Placement((RankPlacement(0, node.name, gpus),)),
                    start_time=-900.0,
                    last_checkpoint_time=rng.choice([None, -300.0, -60.0]),
                )
            )
        used += k
    return tuple(running)


def machine() -> str:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (
        f"{cpu}; {os.cpu_count()} logical CPUs (bench uses one); "
        f"{platform.python_implementation()} {platform.python_version()} "
        f"on {platform.system()} {platform.release()}"
    )


def run_once(snapshot: Snapshot, config: SchedulerConfig) -> tuple[float, list[float], int, int, float, float]:
    from corral.core.ordering import order_pending

    t0 = time.perf_counter()
    c0 = time.process_time()
    cycle = Cycle.of(snapshot, config)
    order = order_pending(snapshot, config, tree=cycle.tree)
    per_job = []
    placed = preempted = 0
    place_time = 0.0
    for p in order:
        s = time.perf_counter()
        d = cycle.decide(p, None)  # on its own: the per-job time, sharing nothing
        dt = time.perf_counter() - s
        per_job.append(dt)
        if isinstance(d, Place):
            placed += 1
            place_time += dt
        preempted += isinstance(d, Preempt)
    return time.perf_counter() - t0, per_job, placed, preempted, place_time, time.process_time() - c0


SCALING_GPUS = (512, 4096, 16384)
SCALING_RACK_NODES = 64


def gang_decision_ms(cluster: Cluster, queues: tuple[QueueConfig, ...], pending: tuple[PendingJob, ...],
                     config: SchedulerConfig, repeat: int) -> float:
    """Median time to decide one 64 x 8 gang that must sit in one rack, the waiting jobs behind it."""
    gang = PendingJob(Job("gang-64x8", "prod", 64, 8, submit_time=-1.0, priority=1000,
                          topology=Topology(gang=TopologyLevel.RACK)))
    snapshot = Snapshot(now=float(len(pending)), cluster=cluster, queues=queues, pending=(gang, *pending), running=())
    times = []
    for _ in range(repeat):
        cycle = Cycle.of(snapshot, config)
        start = time.perf_counter()
        cycle.decide(gang, None)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def scaling(args: argparse.Namespace) -> None:
    """Decisions/s and the 64 x 8 rack gang's decision time at each size (see the module doc)."""
    sizes = (64, 128) if args.smoke else SCALING_GPUS
    config = SchedulerConfig.named(args.policy)
    queues, pending = workload(args.jobs, args.seed)
    rows = []
    for gpus in sizes:
        cluster = Cluster.uniform(gpus // 8, 8, "H100", nodes_per_rack=min(SCALING_RACK_NODES, gpus // 8))
        snapshot = Snapshot(now=float(args.jobs), cluster=cluster, queues=queues, pending=pending, running=())
        best = min((run_once(snapshot, config) for _ in range(args.repeat)), key=lambda r: r[0])
        total, per_job, placed = best[0], sorted(best[1]), best[2]
        gang_ms = gang_decision_ms(cluster, queues, pending, config, max(3, args.repeat)) \
            if gpus >= 512 else float("nan")
        rows.append((gpus, len(cluster.nodes), len(cluster.racks()), len(pending) / total,
                     statistics.median(per_job) * 1e3, per_job[int(0.99 * (len(per_job) - 1))] * 1e3, placed,
                     gang_ms))
    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.2f} (other work shares the CPUs)")
    print(f"{len(pending)} waiting jobs (1-64 GPUs), policy {args.policy}, best of {args.repeat}")
    print(f"{'GPUs':>8} {'nodes':>6} {'racks':>6} {'decisions/s':>12} {'p50 ms':>8} {'p99 ms':>8} {'placed':>7} "
          f"{'64x8 rack gang ms':>18}")
    for gpus, nodes, racks, rate, p50, p99, placed, gang_ms in rows:
        print(f"{gpus:>8,} {nodes:>6,} {racks:>6} {rate:>12,.0f} {p50:>8.3f} {p99:>8.3f} {placed:>7,} {gang_ms:>18.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--policy", default="corral")
    ap.add_argument("--busy", type=float, default=0.0, help="fraction of GPUs held by fragmented running jobs")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--smoke", action="store_true",
                    help="a tiny run (seconds) checking the script end to end (the test suite)")
    ap.add_argument("--scaling", action="store_true",
                    help="decisions/s at 512, 4,096 and 16,384 GPUs side by side, and a 64x8 rack gang's decision")
    args = ap.parse_args()
    print(probe_line(), flush=True)
    if args.smoke:  # the test suite's size: runs end to end in seconds
        args.jobs, args.nodes, args.repeat = 50, 8, 1
    if args.scaling:
        scaling(args)
        return
    cluster = Cluster.uniform(args.nodes, 8, "H100", nodes_per_rack=8)
    queues, pending = workload(args.jobs, args.seed)
    running = fragmented(cluster, args.seed, args.busy) if args.busy > 0 else ()
    snapshot = Snapshot(now=float(args.jobs), cluster=cluster, queues=queues, pending=pending, running=running)
    config = SchedulerConfig.named(args.policy)
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        run_once(snapshot, config)
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
        return
    best = None
    for _ in range(args.repeat):
        result = run_once(snapshot, config)
        if best is None or result[0] < best[0]:
            best = result
    assert best is not None
    total, per_job, placed, preempted, place_time, cpu = best
    per_job_sorted = sorted(per_job)
    p99 = per_job_sorted[int(0.99 * (len(per_job_sorted) - 1))]
    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.2f} (other work shares the CPUs)")
    print(
        f"cluster: {args.nodes} nodes x 8 GPUs = {cluster.total_gpus} GPUs, {len(cluster.racks())} racks; "
        f"{len(pending)} pending jobs (1-64 GPUs), {len(running)} running "
        f"({sum(r.job.total_gpus for r in running)} GPUs busy), policy {args.policy}"
    )
    print(
        f"cycle: {total:.3f} s (best of {args.repeat}); {placed} placed, {preempted} preempt, "
        f"{len(pending) - placed - preempted} pending"
    )
    print(f"cycle CPU time: {cpu:.3f} s -> {len(pending) / cpu:,.0f} decisions per CPU-second")
    print(
        f"decisions/s (every job decided, whole cycle): {len(pending) / total:,.0f}; "
        f"successful placements/s (time inside Place decisions): {placed / max(place_time, 1e-9):,.0f}"
    )
    print(
        f"per-job decision: p50 {statistics.median(per_job) * 1e3:.3f} ms, p99 {p99 * 1e3:.3f} ms, "
        f"max {per_job_sorted[-1] * 1e3:.3f} ms"
    )
    ok = total < 5.0 and len(pending) / total >= 2000
    print(f"targets (>= 2,000 decisions/s on one core, cycle < 5 s): {'met' if ok else 'NOT met'}")
    sys.exit(0)


if __name__ == "__main__":
    main()
