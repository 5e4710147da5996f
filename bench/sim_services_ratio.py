"""The services pipeline's replay time against the combined cycle's, on a slice of the Philly trace.

Replays jobs [a, b) of the file (the clock shifted to start at 0, equal guarantees, as
`sim_slice.py`) once per pipeline and policy, in one process, and prints each replay's CPU seconds
(`time.process_time`), the ratio services / cycle, and a sha256 of the records (start, end,
preemptions, placements): the schedule's fingerprint, to compare two builds' schedules.

Run: .venv/bin/python bench/sim_services_ratio.py [--start A] [--stop B] [--cluster 40x8:H100]
     [--policies corral,fair-las] [--pipelines cycle,services] [--profile FILE]
`--profile FILE` writes cProfile stats of the last replay (read with pstats).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import time
from pathlib import Path

from machine_probe import probe_line

from corral.sim import load_workload, run_simulation
from corral.sim.api import SimResult
from corral.sim.workload import normalised

TRACE = Path(__file__).resolve().parent.parent.parent / "shared" / "traces" / "philly_2017_sep_oct.csv"


def records_hash(result: SimResult) -> str:
    """sha256 of every record's start, end, preemptions and placements (nodes and GPUs)."""
    h = hashlib.sha256()
    for r in result.records:
        spans = [(p.start, p.end, [(k.node, list(k.gpus)) for k in p.ranks]) for p in r.placements]
        h.update(repr((r.id, r.start, r.end, r.preemptions, spans)).encode())
    return h.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--start", type=int, default=20000)
    parser.add_argument("--stop", type=int, default=25000)
    parser.add_argument("--cluster", default="40x8:H100")
    parser.add_argument("--policies", default="corral,fair-las")
    parser.add_argument("--pipelines", default="cycle,services")
    parser.add_argument("--profile", type=Path)
    args = parser.parse_args()
    print(probe_line(), flush=True)
    jobs = list(load_workload(f"philly:{args.trace}").jobs[args.start:args.stop])
    for policy in args.policies.split(","):
        cpu: dict[str, float] = {}
        for pipeline in args.pipelines.split(","):
            profiler = cProfile.Profile() if args.profile is not None else None
            started = time.process_time()
            if profiler is not None:
                profiler.enable()
            result = run_simulation(normalised(jobs, "slice", []), args.cluster, policy=policy, pipeline=pipeline)
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(str(args.profile))
            cpu[pipeline] = time.process_time() - started
            print(f"{policy:9s} {pipeline:8s} cpu {cpu[pipeline]:6.1f} s  cycles {result.stats.cycles:6d}  "
                  f"records {records_hash(result)[:16]}", flush=True)
        if "cycle" in cpu and "services" in cpu:
            print(f"{policy:9s} ratio services / cycle {cpu['services'] / cpu['cycle']:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
