"""Quota's round offline under Kueue's shape: every cohort full, thousands waiting, one job ending a round.

Why: in the live Kueue benchmark (bench/kueue_baseline.py) quota's round runs twenty times a second
with ~13,000 jobs waiting behind full cohorts; a round that reserves a job a waiting job could
preempt plays placement and preemption out (`corral.core.reservation`). This replays such rounds on
the core alone, as the quota service calls it (`quota_round` with the round's memos and a kept
backlog), so a change to the round is measured in seconds instead of minutes of a live stack.

The state: N / 3,000 cohorts of 15 nodes x 8 GPUs, six queues each (guarantee 20, ceiling 120,
the cohort 120), every cohort full (each node one 5-GPU and three 1-GPU jobs), the small workloads
waiting, a third of the medium ones and two large gangs per queue (`WAITING`). Each round one
running job of the next cohort ends; the round reserves for its queue; the jobs that hold quota
and fit are started (placement's step), as the services would.

Run: .venv/bin/python bench/quota_playout.py [--workloads 15000] [--rounds 60] [--smoke] [--profile FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import statistics
import sys
import time
from collections.abc import Sequence

from kueue_baseline import CLASSES, NODES_PER_COHORT, PER_COHORT, QUEUES_PER_COHORT, leaf_queues, queues
from machine_probe import probe_line

from corral.core import Job, PendingJob, Placement, QueueConfig, RankPlacement, RunningJob, SchedulerConfig, Snapshot
from corral.core.backlog import KeptBacklog
from corral.core.decisions import Place
from corral.core.reservation import Reserve, Revoke, quota_round
from corral.core.steps import StepMemos
from corral.sim.inputs import load_cluster

#: the share of each class's workloads waiting (the live run: small ones wait ~90 s, large ~5 s)
WAITING = {"small": 1.0, "medium": 0.3, "large": 0.04}


class Replay:
    """The cluster's jobs as the quota service would hold them between rounds."""

    def __init__(self, workloads: int, scale: float = 1.0) -> None:
        self.cohorts = max(1, workloads // PER_COHORT)
        self.cluster = load_cluster(f"{NODES_PER_COHORT * self.cohorts}x8:H100")
        self.queues = tuple(QueueConfig(q["name"], q["guaranteed_gpus"], q["max_gpus"])
                            for q in queues(self.cohorts)["queues"])
        self.config = SchedulerConfig()
        self.now = 100.0
        self.pending: dict[str, PendingJob] = {}
        self.running: dict[str, RunningJob] = {}
        self.holding: set[str] = set()
        self.backlog = KeptBacklog()
        self.memos = StepMemos()
        leaves = leaf_queues(self.cohorts)
        for q, queue in enumerate(leaves):
            for wc in CLASSES:  # the large gangs are admitted within seconds: few wait
                for i in range(max(1, int(wc.count * scale * WAITING[wc.name]))):
                    job = Job(f"{q:02d}-{wc.name}-{i:03d}", queue, wc.replicas, wc.gpus_per_replica,
                              i * wc.interval_s, priority=wc.priority, estimated_runtime_seconds=wc.runtime_s)
                    self.pending[job.id] = PendingJob(job)
        # each node of a cohort runs one 5-GPU job and three 1-GPU jobs, the cohort's queues in turn
        for c in range(self.cohorts):
            mine = leaves[c * QUEUES_PER_COHORT:(c + 1) * QUEUES_PER_COHORT]
            k = 0
            for node in self.cluster.nodes[c * NODES_PER_COHORT:(c + 1) * NODES_PER_COHORT]:
                for gpus in ((0, 1, 2, 3, 4), (5,), (6,), (7,)):
                    job = Job(f"run-{c}-{k:02d}", mine[k % len(mine)], 1, len(gpus), 0.0,
                              priority=100 if len(gpus) > 1 else 50, estimated_runtime_seconds=0.5)
                    self.running[job.id] = RunningJob(job, Placement((RankPlacement(0, node.name, gpus),)), k * 0.01)
                    k += 1
        for p in self.pending.values():
            self.backlog.put(p, False)

    def snapshot(self) -> Snapshot:
        return Snapshot(self.now, self.cluster, self.queues, tuple(self.pending[i] for i in sorted(self.pending)),
                        tuple(self.running[i] for i in sorted(self.running)))

    def end_one(self, r: int) -> None:
        """The oldest running job of cohort `r % cohorts` ends."""
        cohort = f"cohort-{r % self.cohorts}/"
        mine = sorted((x.start_time, i) for i, x in self.running.items() if x.job.queue.startswith(cohort))
        if mine:
            del self.running[mine[0][1]]

    def round(self) -> tuple[float, int, int]:
        """One quota round then placement's step; (CPU seconds of the quota round, reserved, started)."""
        snapshot = self.snapshot()
        t = time.process_time()
        out = quota_round(snapshot, self.config, reserved=frozenset(self.holding), memos=self.memos,
                          backlog=self.backlog.frozen())
        spent = time.process_time() - t
        reserved = 0
        for d in out.decisions:
            if isinstance(d, Reserve):
                reserved += 1
                self.holding.add(d.job_id)
                self.backlog.put(self.pending[d.job_id], True)
            elif isinstance(d, Revoke):
                self.holding.discard(d.job_id)
                self.backlog.put(self.pending[d.job_id], False)
        started = 0
        for d in self.memos.place(snapshot, self.config, frozenset(self.holding), explain=False):
            if isinstance(d, Place) and d.job_id in self.pending:
                p = self.pending.pop(d.job_id)
                self.holding.discard(d.job_id)
                self.backlog.drop(d.job_id)
                self.running[d.job_id] = RunningJob(p.job, d.placement, self.now)
                started += 1
        self.now += 0.05
        return spent, reserved, started


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", type=int, default=15_000)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--smoke", action="store_true", help="3,000 workloads, a tenth waiting, 10 rounds")
    parser.add_argument("--profile", help="write a cProfile of the rounds here")
    args = parser.parse_args(argv)
    workloads, rounds, scale = (3_000, 10, 0.1) if args.smoke else (args.workloads, args.rounds, 1.0)
    print(probe_line(), flush=True)
    replay = Replay(workloads, scale)
    replay.round()  # the first round builds the memos
    prof = cProfile.Profile(time.process_time) if args.profile else None
    times: list[float] = []
    reserved = started = 0
    if prof:
        prof.enable()
    for r in range(rounds):
        replay.end_one(r)
        spent, n, s = replay.round()
        times.append(spent * 1000)
        reserved += n
        started += s
    if prof:
        prof.disable()
        prof.dump_stats(args.profile)
    print(f"{workloads:,} workloads, {len(replay.pending):,} waiting, {len(replay.running)} running; "
          f"{rounds} rounds: {reserved} reserved, {started} started; quota round ms mean "
          f"{statistics.fmean(times):.1f}, median {statistics.median(times):.1f}, max {max(times):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
