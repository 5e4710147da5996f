"""Replay the whole Philly trace (52,849 jobs, Sep-Oct 2017) through the simulator, per policy.

Prints, for each policy, simulated jobs per wall-second, the engine's cycle count and the share of
wall time spent inside `corral.core.schedule`, then the summaries side by side, and the machine.
Target (issue "Trace simulator"): the whole file under 60 s of wall time per policy on one core.

The default cluster is 80 nodes x 8 H100 (640 GPUs, racks of 8): the trace's GPU-time averages
~465 busy GPUs over the period, so this load is ~73% on average with long bursts above capacity,
and jobs queue. Queues: none given, so each of the 12 virtual clusters is guaranteed 53 GPUs.

Run: .venv/bin/python bench/sim_philly.py [--cluster 80x8:H100] [--policies corral,fifo,...]
     [--limit N] [--json-dir DIR] [--plot DIR] [--compiled] [--pipeline services]
`--compiled` runs the same replay on the core compiled by mypyc (bench/compiled.py).
`--pipeline services` replays the live services' round (quota, then placement, then preemption)
instead of the single combined cycle (slower: a snapshot per cycle; try it with --limit).
Source: Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training
Workloads", USENIX ATC 2019 (job summary as in the petuum/adaptdl OSDI'21 artifact).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from machine_probe import probe_line

from corral.sim import DEFAULT_POLICIES, load_workload, render_comparison, run_simulation, write_json
from corral.sim.api import SimResult
from corral.sim.engine import PIPELINES, EngineStats

TRACE = Path(__file__).resolve().parent.parent.parent / "shared" / "traces" / "philly_2017_sep_oct.csv"


def machine() -> str:
    return (
        f"{platform.node()} | {platform.processor() or platform.machine()} | {os.cpu_count()} cores | "
        f"Python {platform.python_version()} | {platform.platform()}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--cluster", default="80x8:H100")
    parser.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    parser.add_argument("--limit", type=int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-dir", type=Path, help="write each policy's --json document here")
    parser.add_argument("--plot", type=Path, help="write the plots here")
    parser.add_argument("--compiled", action="store_true", help="run on the mypyc-compiled core (bench/compiled.py)")
    parser.add_argument("--pipeline", choices=PIPELINES, default="cycle",
                        help="cycle: the combined cycle; services: quota, placement, preemption in a row")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run (seconds) checking the script end to end (the test suite)")
    args = parser.parse_args(argv)
    print(probe_line(), flush=True)
    if args.smoke:  # the test suite's size: runs end to end in seconds
        args.limit, args.cluster, args.policies = 200, "8x8:H100", "fifo,corral"
    if args.compiled and not os.environ.get("CORRAL_COMPILED_SITE"):
        from compiled import reexec_compiled

        reexec_compiled([str(Path(__file__).resolve()), *(sys.argv[1:] if argv is None else argv)])
    if not args.trace.is_file():
        print(f"trace not found: {args.trace}; pass --trace", file=sys.stderr)
        return 2
    started = time.perf_counter()
    workload = load_workload(f"philly:{args.trace}")
    if args.limit:
        workload = workload.head(args.limit)
    from compiled import core_kind

    loaded = time.perf_counter() - started
    print(f"loaded {len(workload.jobs)} jobs in {loaded:.1f}s; {core_kind()} core; machine: {machine()}")
    results: list[SimResult] = []
    for policy in (p.strip() for p in args.policies.split(",") if p.strip()):
        t0 = time.perf_counter()

        def progress(now: float, stats: EngineStats, policy: str = policy) -> None:
            print(
                f"  {policy}: day {now / 86400:5.1f}, {stats.cycles} cycles, {stats.wall_seconds:6.0f}s wall, "
                f"{stats.schedule_seconds / max(stats.cycles, 1) * 1e3:.2f} ms/cycle",
                flush=True,
            )

        cpu0 = time.process_time()
        try:
            result = run_simulation(workload, args.cluster, policy=policy, seed=args.seed, progress=progress,
                                    pipeline=args.pipeline)
        except Exception as error:  # report and go on with the other policies
            print(
                f"{policy:<9} FAILED after {time.perf_counter() - t0:.0f}s: {type(error).__name__}: {error}", flush=True
            )
            continue
        total = time.perf_counter() - t0
        cpu = time.process_time() - cpu0  # the figure that does not depend on other load
        s = result.stats
        print(
            f"{policy:<9} sim {s.wall_seconds:7.1f}s ({len(workload.jobs) / s.wall_seconds:7.0f} jobs/s), "
            f"core {s.schedule_seconds / s.wall_seconds:4.0%} of it, {s.cycles} cycles "
            f"({s.schedule_seconds / max(s.cycles, 1) * 1e3:.2f} ms each), {s.skipped_cycles} skipped, "
            f"max pending {s.max_pending}; with metrics {total:.1f}s wall, {cpu:.1f}s CPU",
            flush=True,
        )
        if args.json_dir:
            suffix = "" if args.pipeline == "cycle" else f"_{args.pipeline}"
            write_json(result, args.json_dir / f"philly_{policy}{suffix}.json")
        results.append(result)
    print()
    print(render_comparison(results))
    if args.plot:
        from corral.sim.plot import write_plots

        for path in write_plots(results, args.plot):
            print(f"wrote {path}")
    print(f"machine: {machine()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
