"""End-to-end throughput and latency of the live system under a stream of submissions.

The whole of `corral up` runs as separate processes on this machine: embedded nats-server and
Postgres, admission, quota, placement (+ standby), preemption, and one node-agents process hosting
64 simulated nodes x 8 H100 (runtime `sim-timer`: each gang a timer inside the
agent, so the figures are the scheduler's, not Python start-up's; `--runtime sim` for a process
per rank). The benchmark publishes JobSubmitted to the JetStream
inbox at a fixed rate (open loop) — single-node jobs of 1, 2, 4 or 8 GPUs that run for a short
simulated time — and reads every timing back from the event log afterwards.

Prints: placements per second in steady state (GangReserved events per second over the middle
80% of them), p50 / p99 latency submit -> GangReserved and submit -> JobRunning, the machine and
the exact command. Targets: >= 300 placements/s sustained on a 2-core machine (stretch
500); p99 submit-to-placed < 250 ms at 100 jobs/s. For reference: Slurm ~500 jobs/s
(high-throughput guide); Kueue ~43 admissions/s (baseline performance test); kube-scheduler 180
pods/s with extended resources (GPUs).

The cluster's own ceiling: it places at most GPUs / (mean GPUs per job x how long a job holds
them) jobs a second, whatever the scheduler does: the default 64 x 8 GPUs, at 2.6 GPUs per job held
~1.08 s, is ~182/s. Each phase prints its ceiling and says when its rate was above it (the run then
measured the cluster's size). Without `--cluster` the bench sizes it: 64 x 8, or as many 8-GPU
nodes as the highest rate needs with a quarter to spare (`default_cluster`: 135 x 8 for 300/s).

Each `--rate` value is one phase on the same stack; the cluster drains between phases.

Run: .venv/bin/python bench/e2e.py [--rate 200[,600]] [--seconds 10] [--cluster NxG:MODEL]
     [--duration 1.0] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from live import (
    PENDING_BY,
    RUNTIMES,
    LiveStack,
    bus_messages,
    collect,
    cpu_delta,
    deliveries,
    events_by_type,
    job_run,
    latency_ms,
    log_position,
    machine_line,
    report,
    stack_cpu,
    start_stack,
    steady_rate,
    submit_paced,
    wait_placed,
)

from corral.client import Client, new_job_id
from corral.contracts.jobspec import JobSpec, validate_job_spec
from corral.contracts.queues import validate_queues

GPU_MIX = ((1, 0.4), (2, 0.3), (4, 0.2), (8, 0.1))  # mean 2.6 GPUs per job
TARGET_PLACEMENTS = 300.0
STRETCH_PLACEMENTS = 500.0
#: Sustained placements/s each runtime is to reach on a 2-core machine (the peer comparison's
#: targets: the stack's own ceiling with timers, and with a real process per rank).
RUNTIME_TARGETS = {"sim-timer": 600.0, "process": 100.0}
TARGET_P99_MS = 250.0
TARGET_P99_RATE = 100.0


def capacity_ceiling(gpus: int, mean_gpus: float, hold_seconds: float | None) -> float | None:
    """Placements a second the cluster can take at most: its GPUs turned over once per hold
    (None when nothing was held). A rate above it fills the cluster and jobs wait for GPUs."""
    if not hold_seconds or mean_gpus <= 0:
        return None
    return gpus / (mean_gpus * hold_seconds)


#: what a job holds its GPUs for beyond its run, measured at 100-400/s (1.03-1.28 s for 1 s runs)
HOLD_OVERHEAD_SECONDS = 0.1
DEFAULT_NODES = 64


def default_cluster(rates: Sequence[float], duration: float) -> str:
    """64 x 8 H100, or the nodes the highest rate needs (`nodes_for`) when that is more."""
    mean = sum(gpus * weight for gpus, weight in GPU_MIX)
    need = nodes_for(max(rates, default=0.0), mean, duration + HOLD_OVERHEAD_SECONDS)
    return f"{max(DEFAULT_NODES, need)}x8:H100"


def nodes_for(rate: float, mean_gpus: float, hold_seconds: float, gpus_per_node: int = 8,
              headroom: float = 1.25) -> int:
    """Nodes of `gpus_per_node` a cluster needs to take `rate` placements a second with room to spare."""
    return max(1, math.ceil(rate * mean_gpus * hold_seconds * headroom / gpus_per_node))


def job_stream(count: int, duration: float, seed: int, runtime: str = "sim-timer",
               workdir: Path = Path("/")) -> list[tuple[str, JobSpec]]:
    rng = random.Random(seed)
    sizes, weights = zip(*GPU_MIX, strict=True)
    out = []
    base = new_job_id()  # one time-sortable prefix per phase; the index keeps ids unique
    for i in range(count):
        gpus = rng.choices(sizes, weights)[0]
        spec = validate_job_spec({"name": f"e2e-{i}", "queue": "bench", "gpus_per_replica": gpus,
                                  **job_run(runtime, duration, workdir)})
        out.append((f"{base}-{i:05d}", spec))
    return out


async def phase(client: Client, live: LiveStack, rate: float, seconds: float, duration: float, seed: int,
                timeout: float, runtime: str = "sim-timer") -> dict[str, Any]:
    jobs = job_stream(round(rate * seconds), duration, seed, runtime, live.data_dir)
    after = await log_position(client)
    cpu_before, bus_before = stack_cpu(live), bus_messages(live)
    print(f"  phase {rate:g} jobs/s x {seconds:g}s: {len(jobs)} jobs ...", flush=True)
    submit_seconds = await submit_paced(client, jobs, rate)
    ids = [j for j, _ in jobs]
    _, complete = await wait_placed(client, ids, after, timeout)
    await drain(client, ids, timeout)  # so that GPU hold times (placed -> completed) are all known
    cpu = cpu_delta(cpu_before, stack_cpu(live))
    bus_in, bus_out = (after_ - before_ for after_, before_ in zip(bus_messages(live), bus_before, strict=True))
    times = await collect(client, ids, after)
    counts = await events_by_type(client, after)
    placed = [t.placed for t in times.values() if t.placed is not None]
    result = {
        "rate": rate, "seconds": seconds, "jobs": len(jobs), "duration_seconds": duration,
        "submitted_per_s": len(jobs) / submit_seconds, "all_placed": complete,
        "placed": len(placed), "rejected": sum(t.rejected for t in times.values()),
        "placements": steady_rate(placed),
        "submit_to_admitted_ms": latency_ms(times.values(), "admitted"),
        "submit_to_quota_ms": latency_ms(times.values(), "quota"),
        "submit_to_placed_ms": latency_ms(times.values(), "placed"),
        "submit_to_running_ms": latency_ms(times.values(), "running"),
        "cpu_seconds": cpu, "cpu_ms_per_job": sum(cpu.values()) / len(jobs) * 1e3,
        "events_by_type": counts, "deliveries": deliveries(counts), "bus_messages_in": bus_in,
        "bus_messages_out": bus_out,
        "gpu_hold_s": _mean([(t.ended - t.placed).total_seconds() for t in times.values() if t.placed and t.ended]),
        "mean_gpus": sum(spec.gpus_per_replica * spec.replicas for _, spec in jobs) / len(jobs),
    }
    return result


def _ceiling_text(result: dict[str, Any], p: dict[str, Any], capped: list[dict[str, Any]]) -> str:
    ceiling = capacity_ceiling(result["gpus"], p.get("mean_gpus", 0.0), p["gpu_hold_s"])
    if ceiling is None:
        return "     -"
    if p["rate"] > ceiling:
        capped.append(p)
        return f"{ceiling:6.0f} (rate above it)"
    return f"{ceiling:6.0f}"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


async def drain(client: Client, ids: Sequence[str], timeout: float) -> None:
    """Wait until the phase's jobs have ended, so the next phase starts on an empty cluster."""
    wanted = set(ids)
    try:
        await client.wait_for(lambda v: all(v.jobs[j].state.terminal for j in wanted if j in v.jobs),
                              timeout, interval=1.0)
    except TimeoutError:
        print("  (cluster did not drain in time; next phase starts on a busy cluster)", flush=True)


def fmt(d: dict[str, float], key: str) -> str:
    return f"{d[key]:8.0f}" if key in d else "       -"


def render(result: dict[str, Any]) -> str:
    lines = [
        f"machine: {machine_line()}",
        f"cluster: {result['cluster']} ({result['gpus']} GPUs), {result['runtime']} runtime, jobs of 1-8 GPUs "
        f"running {result['duration']:g}s",
        f"command: {result['command']}",
        f"date:    {result['date']}",
        "",
        "  rate  jobs  placed  placements/s (steady / best 1s)   submit->admitted  ->quota  "
        "->placed p50 / p99 ms   ->running p50 / p99 ms   GPUs held (s)   ceiling/s",
    ]
    capped: list[dict[str, Any]] = []
    for p in result["phases"]:
        pl, ad, qu = p["placements"], p["submit_to_admitted_ms"], p["submit_to_quota_ms"]
        pd, ru = p["submit_to_placed_ms"], p["submit_to_running_ms"]
        lines.append(
            f"{p['rate']:6.0f} {p['jobs']:5d} {p['placed']:7d}   {pl.get('steady_per_s', 0):8.1f} / "
            f"{pl.get('best_second', 0):5.0f}              {fmt(ad, 'p50')}  {fmt(qu, 'p50')}  "
            f"{fmt(pd, 'p50')} / {fmt(pd, 'p99')}      {fmt(ru, 'p50')} / {fmt(ru, 'p99')}"
            f"     {p['gpu_hold_s'] or 0:6.2f}   {_ceiling_text(result, p, capped)}")
    for p in capped:
        lines.append(f"  ({p['rate']:g}/s is above what {result['gpus']} GPUs hold at {p['mean_gpus']:.1f} GPUs "
                     f"per job for {p['gpu_hold_s']:.2f} s: that phase measured the cluster's size; "
                     f"--cluster {nodes_for(p['rate'], p['mean_gpus'], p['gpu_hold_s'])}x8:H100 holds it)")
    lines.append("")
    lines.append("CPU per job (ms, every process of the stack incl. Postgres backends; the machine was shared):")
    for p in result["phases"]:
        parts = ", ".join(f"{k} {v / p['jobs'] * 1e3:.1f}" for k, v in sorted(p["cpu_seconds"].items(),
                                                                       key=lambda kv: -kv[1]) if v > 0)
        lines.append(f"{p['rate']:6.0f}/s: {p['cpu_ms_per_job']:6.1f} ms = {parts}")
    lines.append("Events per job (the log during the phase) and what the bus delivered of them to the services:")
    for p in result["phases"]:
        counts = p.get("events_by_type") or {}
        types = {t: n for t, n in counts.items() if not t.startswith(PENDING_BY)}
        parts = ", ".join(f"{t} {n / p['jobs']:.2f}" for t, n in sorted(types.items(), key=lambda kv: -kv[1]))
        lines.append(f"{p['rate']:6.0f}/s: {sum(types.values()) / p['jobs']:5.1f} events, "
                     f"{p.get('deliveries', 0) / p['jobs']:5.1f} deliveries = {parts}")
        if "bus_messages_in" in p:
            lines.append(f"         nats-server: {p['bus_messages_in'] / p['jobs']:.1f} messages in, "
                         f"{p['bus_messages_out'] / p['jobs']:.1f} out per job (every client, heartbeats included)")
        pending = {t.removeprefix(PENDING_BY): n for t, n in counts.items() if t.startswith(PENDING_BY)}
        if pending:
            lines.append("         PlacementPending by writer and code: " + ", ".join(
                f"{t} {n / p['jobs']:.2f}" for t, n in sorted(pending.items(), key=lambda kv: -kv[1])))
    best = max((p["placements"].get("steady_per_s", 0.0) for p in result["phases"]), default=0.0)
    lines.append("")
    verdict = "MET (stretch too)" if best >= STRETCH_PLACEMENTS else "MET" if best >= TARGET_PLACEMENTS else "MISSED"
    kept_up = [p for p in result["phases"] if p["placements"].get("steady_per_s", 0.0) >= 0.97 * p["rate"]]
    hint = ""
    if verdict != "MET (stretch too)" and kept_up and max(p["rate"] for p in kept_up) >= 0.97 * best:
        hint = "; every phase kept up with its rate: offer more than the target to measure past it"
    lines.append(f"target: >= {TARGET_PLACEMENTS:.0f} placements/s sustained (stretch {STRETCH_PLACEMENTS:.0f}) -> "
                 f"{verdict} (best steady {best:.1f}/s{hint})")
    goal = RUNTIME_TARGETS.get(str(result.get("runtime")))
    if goal is not None:
        # a phase offered the target that kept up with it (as above) meets it too: it cannot place more
        met = best >= goal or any(p["rate"] >= goal and p in kept_up for p in result["phases"])
        lines.append(f"target: >= {goal:.0f} placements/s sustained with the {result['runtime']} runtime -> "
                     f"{'MET' if met else 'MISSED'} (best steady {best:.1f}/s)")
    at = [p for p in result["phases"] if abs(p["rate"] - TARGET_P99_RATE) < 1e-9]
    if at:
        p99 = at[0]["submit_to_placed_ms"].get("p99", float("inf"))
        lines.append(f"target: p99 submit->placed < {TARGET_P99_MS:.0f} ms at {TARGET_P99_RATE:.0f} jobs/s -> "
                     f"{'MET' if p99 < TARGET_P99_MS else 'MISSED'} (p99 {p99:.0f} ms)")
    lines.append("reference: Slurm ~500 jobs/s; Kueue ~43 admissions/s; kube-scheduler 180 pods/s with GPUs")
    return "\n".join(lines)


async def run(args: argparse.Namespace, live: LiveStack) -> dict[str, Any]:
    client = await Client.connect(live.context)
    try:
        await client.apply_queues(validate_queues({"queues": [{"name": "bench", "guaranteed_gpus": 0}]}))
        view = await client.wait_for(lambda v: "bench" in v.queues, 30)
        gpus = view.capacity()
        phases = []
        for i, rate in enumerate(args.rate):
            phases.append(await phase(client, live, rate, args.seconds, args.duration, args.seed + i,
                                      args.timeout, args.runtime))
        return {"cluster": args.cluster, "gpus": gpus, "duration": args.duration, "runtime": args.runtime,
                "phases": phases}
    finally:
        await client.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=lambda s: [float(x) for x in s.split(",")], default=[200.0],
                        help="submissions per second; a comma list runs one phase per rate (default 200)")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds of submissions per phase")
    parser.add_argument("--duration", type=float, default=1.0, help="simulated run time of each job (s)")
    parser.add_argument("--cluster", help="NxG:MODEL (default: 64x8:H100, or more nodes when the highest "
                        "--rate needs them: the cluster's ceiling is GPUs / (mean GPUs per job x hold))")
    parser.add_argument("--runtime", choices=RUNTIMES, default="sim-timer",
                        help="node agents' runtime: sim-timer (a timer per gang, default), sim (a Python "
                        "process per rank) or process (each rank a real process: /bin/sleep, under a stepd)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=180.0, help="per phase, after the last submission")
    parser.add_argument("--data-dir", type=Path, help="keep the stack's data and logs here")
    parser.add_argument("--json", type=Path, help="write the figures as JSON here")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run (seconds) checking the script end to end (the test suite)")
    args = parser.parse_args(argv)
    if args.smoke:  # the test suite's size: runs end to end in seconds
        args.rate, args.seconds = [5.0], 2.0
    if args.cluster is None:
        args.cluster = default_cluster(args.rate, args.duration)
    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", "bench/e2e.py", *sys.argv[1:]])
    t0 = time.monotonic()
    print(f"starting the stack ({args.cluster}) ...", flush=True)
    live = start_stack(args.cluster, runtime=args.runtime, data_dir=args.data_dir)
    print(f"  up in {time.monotonic() - t0:.1f}s", flush=True)
    try:
        result = asyncio.run(run(args, live))
    finally:
        live.stop()
    result.update(command=command)
    return report(result, args.json, render)


if __name__ == "__main__":
    sys.exit(main())
