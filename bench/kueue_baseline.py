"""Kueue's baseline scheduler performance test, reshaped for Corral and run through the live system.

The shape (kubernetes-sigs/kueue, test/performance/scheduler/configs/baseline/generator.yaml):
5 cohorts x 6 ClusterQueues = 30 queues, each with a nominal quota of 20 and a borrowing limit of
100 (preemption: reclaim within the cohort, lower priority within the queue). Each queue receives
  small:  350 workloads, 1 unit,   200 ms run time, priority  50, one every  100 ms;
  medium: 100 workloads, 5 units,  500 ms run time, priority 100, one every  500 ms;
  large:   50 workloads, 20 units, 1000 ms run time, priority 200, one every 1200 ms;
15,000 workloads in all. Kueue's published figures (rangespec.yaml, the mean of 5 runs): wall time
351 s (about 43 admissions/s), average time to admission small 215 s, medium 77 s, large 6.7 s.

In Corral a unit is a GPU: the cluster is 15 nodes x 8 GPUs = 120 GPUs per cohort. Each cohort is
a parent queue guaranteed 120 GPUs and capped at 120 (cohorts do not lend to one another); each of
its 6 queues is guaranteed 20 and capped at 120 (20 + borrowing limit 100). small = 1 x 1 GPU,
medium = 1 x 5 GPUs, large = a gang of 5 x 4 GPUs. "Admitted" is Kueue's notion: quota reserved
(QuotaReserved); the time to placement on GPUs (GangReserved) is printed too. Wall time runs from
the first submission to the last workload's completion, as Kueue's does.

`--workloads N` (a multiple of 3,000) runs N / 3,000 cohorts on as many 15-node slices: cohorts
never lend to one another, so one cohort is exactly a fifth of the test, with the same queues,
arrival intervals and contention. The default 3,000 (one cohort) finishes in a few minutes here;
`--workloads 15000` is the full test.

Run: .venv/bin/python bench/kueue_baseline.py [--workloads 3000] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from live import (
    ENDED,
    RUNTIMES,
    JobTimes,
    LiveStack,
    collect,
    cpu_delta,
    job_run,
    log_position,
    machine_line,
    report,
    stack_cpu,
    start_stack,
    wait_placed,
)

from corral.client import Client, new_job_id
from corral.contracts import events as ev
from corral.contracts.jobspec import JobSpec, validate_job_spec
from corral.contracts.queues import validate_queues
from corral.contracts.registry import decode

QUEUES_PER_COHORT, NOMINAL, BORROWING_LIMIT = 6, 20, 100
FULL_WORKLOADS, PER_COHORT, NODES_PER_COHORT = 15_000, 3_000, 15
SMOKE_WORKLOADS = 60
KUEUE: dict[str, Any] = {"wall_s": 351.1, "per_s": 15_000 / 351.1,
                         "avg_admission_s": {"small": 215.5, "medium": 76.8, "large": 6.7}}


@dataclass(frozen=True)
class WorkloadClass:
    name: str
    count: int  # per queue
    interval_s: float
    runtime_s: float
    priority: int
    replicas: int
    gpus_per_replica: int


CLASSES = (
    WorkloadClass("small", 350, 0.1, 0.2, 50, 1, 1),
    WorkloadClass("medium", 100, 0.5, 0.5, 100, 1, 5),
    WorkloadClass("large", 50, 1.2, 1.0, 200, 5, 4),
)


def queues(cohorts: int) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    for c in range(cohorts):
        cohort = f"cohort-{c}"
        out.append({"name": cohort, "guaranteed_gpus": NOMINAL * QUEUES_PER_COHORT,
                    "max_gpus": NOMINAL * QUEUES_PER_COHORT})
        out += [{"name": f"{cohort}/cq-{q}", "guaranteed_gpus": NOMINAL, "max_gpus": NOMINAL + BORROWING_LIMIT}
                for q in range(QUEUES_PER_COHORT)]
    return {"queues": out}


def leaf_queues(cohorts: int) -> list[str]:
    return [f"cohort-{c}/cq-{q}" for c in range(cohorts) for q in range(QUEUES_PER_COHORT)]


def schedule(cohorts: int, runtime: str = "sim-timer", workdir: Path = Path("/")) -> list[tuple[float, str, JobSpec]]:
    """(offset in seconds, job id, spec) for every workload, in submission order."""
    base = new_job_id()
    timed: list[tuple[float, str, JobSpec]] = []
    for q, queue in enumerate(leaf_queues(cohorts)):
        for wc in CLASSES:
            for i in range(wc.count):
                spec = validate_job_spec({
                    "name": f"{wc.name}-{q}-{i}", "queue": queue, "priority": wc.priority,
                    "replicas": wc.replicas, "gpus_per_replica": wc.gpus_per_replica,
                    **job_run(runtime, wc.runtime_s, workdir)})
                timed.append((i * wc.interval_s, f"{base}-{q:02d}-{wc.name[0]}{i:03d}", spec))
    timed.sort(key=lambda t: (t[0], t[1]))
    return timed


async def submit_on_schedule(client: Client, timed: Sequence[tuple[float, str, JobSpec]],
                             max_in_flight: int = 256) -> float:
    gate = asyncio.Semaphore(max_in_flight)
    tasks = []

    async def one(job_id: str, spec: JobSpec) -> None:
        try:
            await client.submit(spec, job_id=job_id, user="bench")
        finally:
            gate.release()

    start = time.monotonic()
    for offset, job_id, spec in timed:
        delay = start + offset - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await gate.acquire()
        tasks.append(asyncio.create_task(one(job_id, spec)))
    await asyncio.gather(*tasks)
    return time.monotonic() - start


def summarise(times: dict[str, JobTimes]) -> dict[str, Any]:
    submitted = [t.submitted for t in times.values() if t.submitted is not None]
    ended = [t.ended for t in times.values() if t.submitted is not None and t.ended is not None]
    first = min(submitted)
    wall = (max(ended, default=first) - first).total_seconds()
    per_class: dict[str, Any] = {}
    for wc in CLASSES:
        mine = [(t, t.submitted) for t in times.values() if t.name.startswith(wc.name + "-") and t.submitted]
        quota = [(t.quota - at).total_seconds() for t, at in mine if t.quota]
        placed = [(t.placed - at).total_seconds() for t, at in mine if t.placed]
        held = [(t.ended - t.placed).total_seconds() for t, _ in mine if t.placed and t.ended]
        per_class[wc.name] = {
            "workloads": len(mine), "admitted": len(quota),
            "avg_admission_s": statistics.fmean(quota) if quota else None,
            "avg_placement_s": statistics.fmean(placed) if placed else None,
            "avg_gpu_hold_s": statistics.fmean(held) if held else None,  # placed -> completed in the log
            "runtime_s": wc.runtime_s,
        }
    return {"workloads": len(times), "completed": len(ended), "wall_s": wall,
            "per_s": len(ended) / wall if wall > 0 else 0.0, "classes": per_class}


async def run(args: argparse.Namespace, live: LiveStack) -> dict[str, Any]:
    client = await Client.connect(live.context)
    try:
        cohorts = args.workloads // PER_COHORT
        await client.apply_queues(validate_queues(queues(cohorts)))
        leaves = set(leaf_queues(cohorts))
        await client.wait_for(lambda v: leaves <= set(v.queues), 30)
        timed = schedule(cohorts, args.runtime, live.data_dir)
        if args.smoke:  # the first workloads of one cohort: checks the script end to end, no figures
            timed = timed[:SMOKE_WORKLOADS]
        ids = [job_id for _, job_id, _ in timed]
        after = await log_position(client)
        span = timed[-1][0]
        print(f"  submitting {len(timed)} workloads over {span:.0f}s into {len(leaves)} queues ...", flush=True)
        cpu_start = stack_cpu(live)
        submit_s = await submit_on_schedule(client, timed)
        cpu_submitted = stack_cpu(live)
        print(f"  submitted in {submit_s:.0f}s; waiting for every workload to finish ...", flush=True)
        _, complete = await wait_placed(client, ids, after, args.timeout, until=ENDED)
        cpu_end = stack_cpu(live)
        times = await collect(client, ids, after)
        waits = await wait_reasons(client, times, after)
        return {"submit_s": submit_s, "all_done": complete, **summarise(times), "waits": waits,
                "cpu_seconds": {"arriving": cpu_delta(cpu_start, cpu_submitted),
                                "draining": cpu_delta(cpu_submitted, cpu_end)}}
    finally:
        await client.close()


_REASONED = ("PlacementPending", "QuotaReserved", "GangReserved", "PreemptRequested", "JobRequeued", "QuotaReleased",
             "JobCompleted")


async def wait_reasons(client: Client, times: dict[str, JobTimes], after: int) -> dict[str, Any]:
    """Where each class's wait goes, from the log: per class, the average seconds per workload spent
    under each PlacementPending code before QuotaReserved (`quota`) and between QuotaReserved and
    GangReserved (`gpus`; "-" = before any reason was written), and how often a class was a victim
    or requeued; how long a reservation held its quota (QuotaReserved to QuotaReleased: the
    cohort's ceiling counts it all that time), and how long after its job's JobCompleted the
    quota was given back (the part of that hold the job no longer used). A reason holds from its
    event until the next reason or reservation."""
    streams = {f"job-{j}": j for j in times}
    seen: dict[str, list[tuple[Any, str, str]]] = {j: [] for j in times}
    quota_log: list[tuple[datetime, str, str]] = []  # (recorded_at, QuotaReserved|QuotaReleased, job), in log order
    victims: dict[str, int] = {}
    position = after
    while batch := await client.store.read_all(position, limit=10000):
        position = batch[-1].position
        for stored in batch:
            job_id = streams.get(stored.stream)
            if job_id is None or stored.type not in _REASONED:
                continue
            code = ""
            if stored.type == "PlacementPending":
                event = decode(stored.data)
                assert isinstance(event, ev.PlacementPending)
                code = event.reason.code
            elif stored.type == "PreemptRequested":
                victims[job_id] = victims.get(job_id, 0) + 1
            if stored.type in ("QuotaReserved", "QuotaReleased"):
                quota_log.append((stored.recorded_at, stored.type, job_id))
            seen[job_id].append((stored.recorded_at, stored.type, code))
    out: dict[str, Any] = {}
    for wc in CLASSES:
        mine = [t for t in times.values() if t.name.startswith(wc.name + "-") and t.submitted]
        phases: dict[str, dict[str, float]] = {"quota": {}, "gpus": {}}
        requeued = 0
        held: list[float] = []
        after_end: list[float] = []
        for t in mine:
            at, phase, code = t.submitted, "quota", "-"
            since = ended = None
            for when, kind, c in seen[t.job_id]:
                span = (when - at).total_seconds() if at is not None else 0.0
                if kind == "QuotaReserved":
                    since = when
                elif kind == "JobCompleted":
                    ended = when
                elif kind == "QuotaReleased" and since is not None:
                    held.append((when - since).total_seconds())
                    if ended is not None:
                        after_end.append((when - ended).total_seconds())
                    since = None
                if kind == "PlacementPending":
                    phases[phase][code] = phases[phase].get(code, 0.0) + span
                    at, code = when, c
                elif kind == "QuotaReserved" and phase == "quota":
                    phases[phase][code] = phases[phase].get(code, 0.0) + span
                    at, phase, code = when, "gpus", "-"
                elif kind == "GangReserved" and phase == "gpus":
                    phases[phase][code] = phases[phase].get(code, 0.0) + span
                    at, phase, code = None, "done", "-"
                elif kind == "JobRequeued":
                    requeued += 1
                    at, phase, code = when, "quota", "-"
        n = max(1, len(mine))
        out[wc.name] = {"quota": {c: s / n for c, s in sorted(phases["quota"].items())},
                        "gpus": {c: s / n for c, s in sorted(phases["gpus"].items())},
                        "preempted": sum(victims.get(t.job_id, 0) for t in mine), "requeued": requeued,
                        "quota_held_s": statistics.fmean(held) if held else None,
                        "quota_back_after_end_s": statistics.fmean(after_end) if after_end else None}
    return {"classes": out, "quota": quota_in_use(quota_log, times)}


def quota_in_use(quota_log: Sequence[tuple[datetime, str, str]], times: dict[str, JobTimes]) -> dict[str, Any]:
    """How much of each cohort's quota (120 GPUs) was reserved, averaged over time from its first
    reservation to its last release, and how soon quota given back was reserved again (per
    reservation: the seconds since the latest release in its cohort; the median).

    Why: the cohorts' ceiling is what the classes wait on (MAX_GPUS_EXCEEDED). Quota that is given
    back and not yet reserved again is the part of that wait the scheduler itself adds: Kueue
    admits as soon as quota frees; a round-based quota service, only at its next round."""
    held: dict[str, int] = {}
    holders: dict[str, set[str]] = {}
    last: dict[str, datetime] = {}
    first: dict[str, datetime] = {}
    area: dict[str, float] = {}
    freed_at: dict[str, datetime] = {}
    gaps: list[float] = []
    for at, kind, job_id in quota_log:
        t = times[job_id]
        cohort = t.queue.split("/", 1)[0]
        if cohort in last:
            area[cohort] = area.get(cohort, 0.0) + held.get(cohort, 0) * (at - last[cohort]).total_seconds()
        last[cohort] = at
        first.setdefault(cohort, at)
        mine = holders.setdefault(cohort, set())
        if kind == "QuotaReserved" and job_id not in mine:
            if cohort in freed_at:
                gaps.append((at - freed_at[cohort]).total_seconds())
            mine.add(job_id)
            held[cohort] = held.get(cohort, 0) + t.gpus
        elif kind == "QuotaReleased" and job_id in mine:
            mine.discard(job_id)
            held[cohort] = held.get(cohort, 0) - t.gpus
            freed_at[cohort] = at
    capacity = NOMINAL * QUEUES_PER_COHORT
    use = [area[c] / (last[c] - first[c]).total_seconds() / capacity
           for c in area if (last[c] - first[c]).total_seconds() > 0]
    return {"in_use": statistics.fmean(use) if use else None, "capacity_gpus": capacity,
            "reserved_again_after_s": statistics.median(gaps) if gaps else None}


def render_waits(waits: dict[str, Any]) -> list[str]:
    lines = ["", "average seconds per workload waiting under each reason (before quota | before GPUs):"]
    for name, w in waits["classes"].items():
        quota = ", ".join(f"{c} {s:.1f}" for c, s in w["quota"].items() if s >= 0.05) or "-"
        gpus = ", ".join(f"{c} {s:.1f}" for c, s in w["gpus"].items() if s >= 0.05) or "-"
        lines.append(f"  {name:7} quota: {quota} | GPUs: {gpus} | preempted {w['preempted']}, "
                     f"requeued {w['requeued']}; quota held {fmt_s(w.get('quota_held_s')).strip()} s, "
                     f"given back {fmt_s(w.get('quota_back_after_end_s')).strip()} s after the job ended")
    q = waits["quota"]
    if q["in_use"] is not None:
        lines.append(f"quota in use: {100 * q['in_use']:.0f}% of each cohort's {q['capacity_gpus']} GPUs "
                     f"(time-weighted); quota given back was reserved again after a median "
                     f"{q['reserved_again_after_s'] or 0:.2f} s")
    return lines


def fmt_s(value: float | None) -> str:
    return f"{value:8.1f}" if value is not None else "       -"


def render(result: dict[str, Any]) -> str:
    k = KUEUE
    lines = [
        f"machine: {machine_line()}",
        f"cluster: {result['cluster']} ({result['gpus']} GPUs), {result['runtime']} runtime; "
        f"{result['cohorts']} cohort(s) x 6 queues (guaranteed 20, max 120 GPUs each)",
        f"command: {result['command']}",
        f"date:    {result['date']}",
        "",
        f"{'':28}{'Corral':>12}{'Kueue (15,000)':>18}",
        f"{'workloads':28}{result['workloads']:>12,}{FULL_WORKLOADS:>18,}",
        f"{'completed':28}{result['completed']:>12,}{FULL_WORKLOADS:>18,}",
        f"{'wall time (s)':28}{result['wall_s']:>12.1f}{k['wall_s']:>18.1f}",
        f"{'admissions per second':28}{result['per_s']:>12.1f}{k['per_s']:>18.1f}",
    ]
    for name, c in result["classes"].items():
        lines.append(f"{'avg time to admission ' + name + ' (s)':28}{fmt_s(c['avg_admission_s']):>12}"
                     f"{k['avg_admission_s'][name]:>18.1f}")
    for name, c in result["classes"].items():
        lines.append(f"{'avg time to GPUs ' + name + ' (s)':28}{fmt_s(c['avg_placement_s']):>12}{'-':>18}")
    for name, c in result["classes"].items():
        lines.append(f"{'GPUs held ' + name + ' (s)':28}{fmt_s(c['avg_gpu_hold_s']):>12}"
                     f"{'runs ' + format(c['runtime_s'], 'g') + ' s':>18}")
    if result["workloads"] != FULL_WORKLOADS:
        lines.append(f"note: {result['workloads']:,} workloads = {result['cohorts']} of Kueue's 5 independent "
                     "cohorts (same queues, intervals and contention per cohort)")
    if not result["all_done"]:
        lines.append("note: not every workload finished before --timeout")
    if result.get("waits"):
        lines += render_waits(result["waits"])
    if result.get("cpu_seconds"):
        lines += render_cpu(result["cpu_seconds"], result["submit_s"], result["wall_s"], result["workloads"])
    return "\n".join(lines)


def render_cpu(cpu: dict[str, dict[str, float]], submit_s: float, wall_s: float, workloads: int) -> list[str]:
    """CPU of each part of the stack while workloads arrive and while the rest drains: which part
    a slower machine (bench/machine_probe.py) or a change moved, and whether the machine was full."""
    lines = ["", "CPU seconds of the stack (Postgres backends included), as cores busy on average:"]
    for phase, seconds in (("arriving", submit_s), ("draining", max(wall_s - submit_s, 1e-9))):
        parts = cpu[phase]
        total = sum(parts.values())
        shown = ", ".join(f"{k} {v / seconds:.2f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v > 0)
        lines.append(f"  {phase} ({seconds:.0f} s): {total / seconds:.2f} cores = {shown}")
    everything = sum(sum(p.values()) for p in cpu.values())
    lines.append(f"  per workload: {everything / max(workloads, 1) * 1e3:.1f} ms")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", type=int, default=PER_COHORT,
                        help=f"a multiple of {PER_COHORT} (one cohort each; default {PER_COHORT}; "
                        f"{FULL_WORKLOADS} is Kueue's full test)")
    parser.add_argument("--runtime", choices=RUNTIMES, default="sim-timer",
                        help="node agents' runtime: sim-timer (default), sim (a Python process per rank) or "
                        "process (each rank a real process: /bin/sleep, under a stepd)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait after the last submission")
    parser.add_argument("--data-dir", type=Path, help="keep the stack's data and logs here")
    parser.add_argument("--json", type=Path, help="write the figures as JSON here")
    parser.add_argument("--smoke", action="store_true",
                        help=f"only the first {SMOKE_WORKLOADS} workloads of one cohort (what the test suite runs)")
    args = parser.parse_args(argv)
    if args.workloads % PER_COHORT or not PER_COHORT <= args.workloads <= FULL_WORKLOADS:
        parser.error(f"--workloads must be {PER_COHORT}, {2 * PER_COHORT}, ... or {FULL_WORKLOADS} "
                     "(whole cohorts of Kueue's test)")
    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", "bench/kueue_baseline.py", *sys.argv[1:]])
    cohorts = args.workloads // PER_COHORT
    cluster = f"{NODES_PER_COHORT * cohorts}x8:H100"
    print(f"starting the stack ({cluster}) ...", flush=True)
    live = start_stack(cluster, runtime=args.runtime, data_dir=args.data_dir)
    try:
        result = asyncio.run(run(args, live))
    finally:
        live.stop()
    result.update(cluster=cluster, gpus=NODES_PER_COHORT * cohorts * 8, cohorts=cohorts, runtime=args.runtime,
                  command=command)
    return report(result, args.json, render)


if __name__ == "__main__":
    sys.exit(main())
