"""Replay a slice of the Philly trace (jobs [a, b) of the file, the clock shifted to start at 0) per
policy, one process, and print the verdict figures with the replay's CPU seconds.

Why a slice: the whole Sep-Oct replay at 40 x 8 takes ~10 min of CPU per policy; a busy slice
(jobs 20,000-26,000 has the deepest contention of the first weeks) answers in seconds and moves
with the whole trace's figures. Queues: every queue in the slice gets an equal guarantee.

Run: .venv/bin/python bench/sim_slice.py [--start A] [--stop B] [--cluster 40x8:H100]
     [--policies corral,fair-las,fair-las:2,fair-las:4r] [--profile FILE] [--queues] [--pipeline services]
`fair-las:X` replays fair-las with the starvation limit X (`SchedulerConfig.starvation_limit`; 0: off)
and `promotion_resets_level` off (a promotion moves only the order), `fair-las:Xr` with it on (a promoted
job preempts as level 0 both ways),
`fair-las:Xd` with it and `defragment` (smaller jobs moved to make a whole node for a gang; `Xrd` both),
`fair-las:Xa` with `promotion_arrives` (a promoted job joins level 0 as if submitted at its promotion;
plain `fair-las` is `fair-las:4ra`); a trailing `pS` sets `level_protection_seconds` to S and `cK`
`level_protection_count` to K (`fair-las:4rap3600c4`: a job preempted n times is no level victim for
its first S x (2**n - 1) seconds of a run, and not at all from 4 preemptions on);
`--profile FILE` writes cProfile stats of the last policy's replay to FILE (read with pstats);
`--pipeline services` replays the live services' round (`corral.sim.engine`) instead of the combined cycle;
`--queues` prints each queue's mean allocation / fair share and share of GPU time; `--by-class` each
gang class's and queue's jobs, average wait to the first start and average JCT (h);
`--high-priority F` gives a seeded share F of the slice's jobs priority 900 (the trace has none, all 0),
for the rules that read priorities within a queue. Each policy's line ends with the most preemptions
of one job (and its id).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import random
import time
from pathlib import Path

import msgspec
from machine_probe import probe_line

from corral.core import SchedulerConfig
from corral.sim import load_workload, run_simulation
from corral.sim.api import SimResult
from corral.sim.versus import verdict_rows
from corral.sim.workload import normalised

TRACE = Path(__file__).resolve().parent.parent.parent / "shared" / "traces" / "philly_2017_sep_oct.csv"


def replay(jobs: list, cluster: str, policy: str, profile: Path | None,
           pipeline: str = "cycle") -> tuple[SimResult, float]:
    """One policy's replay of the slice and its CPU seconds (`time.process_time`); `fair-las:X` is
    fair-las with the starvation limit X."""
    workload = normalised(jobs, "slice", [])
    name, _, limit = policy.partition(":")
    limit, _, protect = limit.partition("p")
    protect, _, count = protect.partition("c")
    flags = limit.lstrip("0123456789.")
    config = (dataclasses.replace(SchedulerConfig.named(name), starvation_limit=float(limit.rstrip("rda")),
                                  promotion_resets_level="r" in flags, defragment="d" in flags,
                                  promotion_arrives="a" in flags,
                                  level_protection_seconds=float(protect or 0),
                                  level_protection_count=int(count or 0)) if limit else None)
    profiler = cProfile.Profile() if profile is not None else None
    started = time.process_time()
    if profiler is not None:
        profiler.enable()
    result = run_simulation(workload, cluster, policy=name, config=config, pipeline=pipeline)
    result.policy = policy
    if profiler is not None:
        profiler.disable()
        assert profile is not None
        profiler.dump_stats(str(profile))
    return result, time.process_time() - started


def with_priorities(jobs: list, share: float, seed: int = 7) -> list:
    """`jobs` with a seeded share `share` of them at priority 900 (the others as they are)."""
    if share <= 0:
        return jobs
    rng = random.Random(seed)
    return [dataclasses.replace(j, spec=msgspec.structs.replace(j.spec, priority=900)) if rng.random() < share else j
            for j in jobs]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--start", type=int, default=20000)
    parser.add_argument("--stop", type=int, default=26000)
    parser.add_argument("--cluster", default="40x8:H100")
    parser.add_argument("--policies", default="corral,fair-las")
    parser.add_argument("--profile", type=Path)
    parser.add_argument("--queues", action="store_true")
    parser.add_argument("--by-class", action="store_true")
    parser.add_argument("--pipeline", default="cycle", choices=("cycle", "services"))
    parser.add_argument("--high-priority", type=float, default=0.0, help="share of the jobs at priority 900")
    parser.add_argument("--smoke", action="store_true", help="a tiny slice (seconds) checking the script end to end")
    args = parser.parse_args()
    if args.smoke:
        args.start, args.stop, args.policies = 20000, 20200, "corral,fair-las:4ra"
    print(probe_line(), flush=True)
    jobs = with_priorities(list(load_workload(f"philly:{args.trace}").jobs[args.start:args.stop]), args.high_priority)
    results, cpu = [], {}
    for policy in args.policies.split(","):
        result, cpu[policy] = replay(jobs, args.cluster, policy, args.profile, args.pipeline)
        results.append(result)
    ends = {r.policy: max(x.end for x in r.records if x.end is not None) / 3600 for r in results}
    churn = {r.policy: max(r.records, key=lambda x: (x.preemptions, x.id)) for r in results}
    for row in verdict_rows(results):
        waits = " ".join(f"{c}:{w / 3600:.2f}" for c, w in row["gang_class_avg_wait_seconds"].items())
        idle = " ".join(f"{c}:{v * 100:.1f}" for c, v in row["idle_share"].items())
        print(f"{row['policy']:11s} jct {row['avg_jct_seconds'] / 3600:.2f} h ({row['avg_jct_vs_baseline']:.2f}) "
              f"p95 {row['p95_jct_seconds'] / 3600:.1f} h util {row['utilisation'] * 100:.1f}% "
              f"jain {row['jain_fairness']:.3f} loss {row['preemption_loss_share'] * 100:.2f}% "
              f"cpu {cpu[row['policy']]:.1f} s | last end {ends[row['policy']]:.1f} h (bound util "
              f"{row['utilisation_bound'] * 100:.1f}%) | most preempted {churn[row['policy']].preemptions}x "
              f"({churn[row['policy']].id}) | waits h {waits} | idle % {idle}")
    if args.queues:
        for r in results:
            figures = " ".join(f"{q.name[:6]}:{q.mean_fair_share_ratio or 0:.2f}/{q.share_of_gpu_time * 100:.0f}%"
                               for q in r.summary.queues)
            print(f"{r.policy:9s} queues (alloc/fair, GPU time) {figures}")
    if args.by_class:
        for r in results:
            by_class(r)
    return 0


def _gang_class(gpus: int) -> str:
    return next(name for top, name in ((1, "1"), (2, "2"), (4, "3-4"), (8, "5-8"), (16, "9-16")) if gpus <= top) \
        if gpus <= 16 else "17+"


def by_class(result: SimResult) -> None:
    """Jobs, average wait to the first start and average JCT (h) of the finished jobs, by gang class and queue."""
    done = [x for x in result.records if x.end is not None and x.start is not None]
    for title, of in (("gang class", lambda x: _gang_class(x.gpus)), ("queue", lambda x: x.queue[:6])):
        groups: dict[str, list] = {}
        for x in done:
            groups.setdefault(of(x), []).append(x)
        cells = " ".join(f"{k}:{len(g)}/{sum(x.start - x.submit for x in g) / len(g) / 3600:.1f}/"
                         f"{sum(x.end - x.submit for x in g) / len(g) / 3600:.1f}"
                         for k, g in sorted(groups.items(), key=lambda kv: -len(kv[1])))
        print(f"{result.policy:11s} by {title} (jobs/wait h/JCT h) {cells}")


if __name__ == "__main__":
    raise SystemExit(main())
