"""Kueue's baseline shape (bench/kueue_baseline.py) replayed through the simulator, with the services' pipeline.

Why: the live benchmark takes minutes on this shared machine and its figures mix policy with the
control plane's delays; a question about policy ("why does a 20-GPU gang of priority 200 wait so
long?") is answered faster, and deterministically, on the simulator's virtual clock. The plain
simulator runs one full `schedule` per cycle; the live system splits that decision in three
services, and this replay runs their round (`corral.core.pipeline.run_round`) on every cycle:
quota's reservations (kept between cycles, given back when the job starts, is requeued or would
be taken back at once: `Revoke`), placement over the jobs holding quota, preemption on the state
where those run.
The decisions take no time; the live system's delays are modelled only crudely, by `--lag`: each
job holds its GPUs (and its quota) a random 0 to 2 x LAG seconds longer than it runs (seeded; the
live stack held a 0.2 s job's GPUs 0.5-1.5 s). A victim stops `--grace` seconds after it is asked
(the sim-timer runtime stops at once).

Run: .venv/bin/python bench/kueue_sim.py [--workloads 3000] [--lag 0.5] [--grace 0.1] [--json FILE] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kueue_baseline import CLASSES, KUEUE, NODES_PER_COHORT, PER_COHORT, SMOKE_WORKLOADS, leaf_queues, queues
from machine_probe import probe_line

from corral.core import Decision, QueueConfig, SchedulerConfig, Snapshot
from corral.core.pipeline import run_round
from corral.core.reservation import Reserve, Revoke
from corral.sim import run_simulation
from corral.sim.workload import Workload, sim_job


class ServicesPipeline:
    """The quota, placement and preemption services' decisions on one snapshot (module docstring)."""

    def __init__(self) -> None:
        self.reserved: set[str] = set()
        self.reserved_at: dict[str, float] = {}  # first reservation of each job
        self.waits: dict[str, dict[str, float]] = {}  # job -> reason code -> seconds before quota
        self._last: dict[str, tuple[float, str]] = {}

    def __call__(self, snapshot: Snapshot, config: SchedulerConfig) -> list[Decision]:
        now = snapshot.now
        waiting = {p.job.id for p in snapshot.pending}
        self.reserved &= waiting  # started or requeued: quota given back
        decided = run_round(snapshot, config, holding=frozenset(self.reserved))
        for d in decided.quota:
            self._note(d.job_id, now, "reserved" if isinstance(d, Reserve) else str(d.reason.code))
            if isinstance(d, Reserve):
                self.reserved.add(d.job_id)
                self.reserved_at.setdefault(d.job_id, now)
            elif isinstance(d, Revoke):
                self.reserved.discard(d.job_id)
        return [*decided.placed, *decided.preempts]

    def _note(self, job_id: str, now: float, code: str) -> None:
        """Charge the time since this job's last decision to the reason it waited with."""
        last = self._last.get(job_id)
        if last is not None and last[1] != "reserved":
            spent = self.waits.setdefault(job_id, {})
            spent[last[1]] = spent.get(last[1], 0.0) + now - last[0]
        self._last[job_id] = (now, code)


def workload(cohorts: int, grace: float, lag: float, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    jobs = [sim_job(f"{q:02d}-{wc.name}-{i:03d}", queue, i * wc.interval_s,
                    round(wc.runtime_s + rng.uniform(0, 2 * lag), 3), wc.replicas,
                    wc.gpus_per_replica, priority=wc.priority, checkpoint_grace_seconds=grace)
            for q, queue in enumerate(leaf_queues(cohorts)) for wc in CLASSES for i in range(wc.count)]
    jobs.sort(key=lambda j: (j.submit, j.id))
    return Workload(tuple(jobs), f"kueue baseline, {cohorts} cohort(s)")


def run(workloads: int, grace: float, lag: float, smoke: bool) -> dict[str, Any]:
    cohorts = workloads // PER_COHORT
    load = workload(cohorts, grace, lag)
    if smoke:
        load = load.head(SMOKE_WORKLOADS)
    tree = tuple(QueueConfig(q["name"], q["guaranteed_gpus"], q["max_gpus"]) for q in queues(cohorts)["queues"])
    pipeline = ServicesPipeline()
    started = time.process_time()
    result = run_simulation(load, f"{NODES_PER_COHORT * cohorts}x8:H100", policy="corral", queues=tree,
                            scheduler=pipeline)
    cpu = time.process_time() - started
    records = result.records
    ends = [r.end for r in records if r.end is not None]
    classes: dict[str, Any] = {}
    for wc in CLASSES:
        mine = [r for r in records if f"-{wc.name}-" in r.id]
        quota = [pipeline.reserved_at[r.id] - r.submit for r in mine if r.id in pipeline.reserved_at]
        start = [r.start - r.submit for r in mine if r.start is not None]
        reasons: dict[str, float] = {}
        for r in mine:
            for code, s in pipeline.waits.get(r.id, {}).items():
                reasons[code] = reasons.get(code, 0.0) + s / len(mine)
        classes[wc.name] = {"workloads": len(mine), "avg_admission_s": statistics.fmean(quota) if quota else None,
                            "avg_start_s": statistics.fmean(start) if start else None,
                            "preemptions": sum(r.preemptions for r in mine),
                            "quota_wait_by_reason_s": dict(sorted(reasons.items()))}
    return {"workloads": len(records), "completed": len(ends), "wall_s": max(ends, default=0.0),
            "cpu_s": cpu, "grace_s": grace, "lag_s": lag, "classes": classes}


def render(out: dict[str, Any]) -> str:
    lines = [f"{out['workloads']:,} workloads, {out['completed']:,} completed, simulated wall "
             f"{out['wall_s']:.1f} s (CPU {out['cpu_s']:.1f} s); lag {out['lag_s']} s, "
             f"victims stop {out['grace_s']} s after asked",
             f"{'class':8}{'admission (s)':>15}{'Kueue':>8}{'start (s)':>11}{'preempted':>11}  "
             "seconds per workload before quota, by reason"]
    for name, c in out["classes"].items():
        adm = f"{c['avg_admission_s']:.1f}" if c["avg_admission_s"] is not None else "-"
        st = f"{c['avg_start_s']:.1f}" if c["avg_start_s"] is not None else "-"
        why = ", ".join(f"{k} {v:.1f}" for k, v in c["quota_wait_by_reason_s"].items() if v >= 0.05) or "-"
        lines.append(f"{name:8}{adm:>15}{KUEUE['avg_admission_s'][name]:>8.1f}{st:>11}{c['preemptions']:>11}  {why}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", type=int, default=PER_COHORT, help=f"a multiple of {PER_COHORT}")
    parser.add_argument("--lag", type=float, default=0.5, help="mean seconds a job holds GPUs beyond its run")
    parser.add_argument("--grace", type=float, default=0.1, help="seconds a victim takes to stop")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--smoke", action="store_true", help=f"only the first {SMOKE_WORKLOADS} workloads")
    args = parser.parse_args(argv)
    print(probe_line(), flush=True)
    out = run(args.workloads, args.grace, args.lag, args.smoke)
    print(render(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
