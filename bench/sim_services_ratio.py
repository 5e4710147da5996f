"""The services pipeline's replay time against the combined cycle's, on a slice of the Philly trace.

Replays jobs [a, b) of the file (the clock shifted to start at 0, equal guarantees, as
`sim_slice.py`) once per pipeline and policy, in one process, and prints each replay's CPU seconds
(`time.process_time`), the ratio services / cycle, and a sha256 of the records (start, end,
preemptions, placements): the schedule's fingerprint, to compare two builds' schedules.

Run: .venv/bin/python bench/sim_services_ratio.py [--start A] [--stop B] [--cluster 40x8:H100]
     [--policies corral,fair-las] [--pipelines cycle,services] [--profile FILE] [--smoke]
`--profile FILE` writes cProfile stats of the last replay (read with pstats); `--smoke` replays
jobs 20,000-20,200 on 8x8 (the test suite runs it).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from machine_probe import probe_line
from sim_slice import TRACE, replay

from corral.sim import load_workload


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--start", type=int, default=20000)
    parser.add_argument("--stop", type=int, default=25000)
    parser.add_argument("--cluster", default="40x8:H100")
    parser.add_argument("--policies", default="corral,fair-las")
    parser.add_argument("--pipelines", default="cycle,services")
    parser.add_argument("--profile", type=Path)
    parser.add_argument("--smoke", action="store_true", help="jobs 20,000-20,200 on 8x8:H100")
    args = parser.parse_args()
    if args.smoke:
        args.start, args.stop, args.cluster = 20000, 20200, "8x8:H100"
    print(probe_line(), flush=True)
    jobs = list(load_workload(f"philly:{args.trace}").jobs[args.start:args.stop])
    for policy in args.policies.split(","):
        cpu: dict[str, float] = {}
        for pipeline in args.pipelines.split(","):
            result, cpu[pipeline] = replay(jobs, args.cluster, policy, args.profile, pipeline)
            print(f"{policy:9s} {pipeline:8s} cpu {cpu[pipeline]:6.1f} s  cycles {result.stats.cycles:6d}  "
                  f"records {result.schedule_hash()[:16]}", flush=True)
        if "cycle" in cpu and "services" in cpu:
            print(f"{policy:9s} ratio services / cycle {cpu['services'] / cpu['cycle']:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
