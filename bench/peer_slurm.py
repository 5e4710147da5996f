"""Corral against Slurm on the same machine, same workloads, real processes: one table of ratios.

Slurm 22.05 from Debian's packages runs in a temporary folder (`slurm_local`: slurmctld, one
`slurmd -N nodeN` per node, munged, fake GPU device files in gres.conf, the high-throughput
SchedulerParameters), then Corral (`corral up --cluster 4x8:H100`'s stack, runtime `process`);
one system up at a time. Each runs the same workloads:

- A:  2,000 jobs of 1 GPU running `/bin/sleep 0.2`, submitted at once;
- B1: 100 gangs of 2 nodes x 8 GPUs running `sleep 1` on every rank (Slurm: `sbatch -N2 --wrap
      "srun job.sh"`, a step with a rank per node; Corral: replicas 2 x 8 GPUs), submitted at once;
- B2: 1,000 A jobs and 100 B gangs interleaved (ten A, one B, ...), submitted at once;
- L:  60 A jobs at 2 a second on an idle cluster: submit -> start latency.

Every job is the same bash script on both systems (`JOB_SCRIPT`): it appends its start time
(bash's $EPOCHREALTIME, no extra process), runs /bin/sleep, appends its end time. Submit times are
this script's clock just before each submission (Slurm: `sbatch`, 8 at a time, as a user's
script would; Corral: `Client.submit` from this process, 256 in flight, as the live benchmarks).
So: wall = first submission to the last rank's end; start = submission to the job's first rank
running; jobs/s = jobs / wall. The system counts as done when it says so (squeue empty; Corral:
every job ended in the event log), after which its CPU is read. For Corral's L the table is
followed by where that start goes, hop by hop (`HOPS`): the times the event log records for each
job (JobSubmitted's `occurred_at` is when admission received it, WorkerStarted's the node's time
of the rank's start, the others' `recorded_at`) and the job script's first line.

CPU per job is every process of the system (`proc_account`: the daemons by name, the processes
that live for one job under the name of what reaped them, e.g. slurmstepd with its job, Corral's
stepds and jobs under node-agents) over the run, divided by jobs; the client's CPU (sbatch
processes; Corral's submitting client in this process) is shown apart and not in the total.

Run: .venv/bin/python bench/peer_slurm.py [--workloads A,B1,B2,L] [--systems slurm,corral]
     [--json FILE] [--smoke] [--slurm-defaults] [--a-jobs N]
Needs Slurm and munge: `apt-get install -y slurm-wlm munge` (root: the GPU files are mknod'ed).
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import proc_account
import slurm_local
from live import LiveStack, log_position, machine_line, percentile, report, stack_roots, start_stack, wait_placed

from corral.client import Client, new_job_id
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.queues import validate_queues

JOB_SCRIPT = """#!/bin/bash
# A peer-benchmark job: its start and end, appended without a process of their own, around a sleep.
tag=${SLURM_JOB_ID:-$CORRAL_JOB_ID}; rank=${SLURM_PROCID:-${RANK:-0}}
echo "$tag $rank s $EPOCHREALTIME" >> "$2"
/bin/sleep "$1"
echo "$tag $rank e $EPOCHREALTIME" >> "$2"
"""
NODES, GPUS = 4, 8
SBATCH_PARALLEL = 8
TARGETS = {"A": ("wall", 1.0), "B1": ("wall", 0.7), "B2": ("wall", 1.0), "L": ("start_p50", 0.35)}
CPU_TARGET = ("A", 2.0)


@dataclass(frozen=True)
class Job:
    offset: float  # seconds after the workload's start it is submitted
    nodes: int  # ranks, one per node
    gpus: int  # per rank
    seconds: float


def workload(name: str, smoke: bool, a_jobs: int | None = None) -> list[Job]:
    a, b = Job(0.0, 1, 1, 0.2), Job(0.0, 2, GPUS, 1.0)
    if name == "A":
        return [a] * (a_jobs or (20 if smoke else 2000))
    if name == "B1":
        return [b] * (3 if smoke else 100)
    if name == "B2":
        gangs, small = (2, 5) if smoke else (100, 10)
        return ([a] * small + [b]) * gangs
    if name == "L":
        count, every = (6, 0.25) if smoke else (60, 0.5)
        return [Job(i * every, 1, 1, 0.2) for i in range(count)]
    raise ValueError(f"unknown workload {name!r}: A, B1, B2 or L")


DESCRIBED = {"A": "2,000 x 1 GPU, sleep 0.2, at once", "B1": "100 gangs 2 nodes x 8 GPUs, sleep 1",
             "B2": "1,000 A + 100 B interleaved", "L": "60 A at 2/s, idle cluster"}


# ---- what both systems share ----------------------------------------------------------------------

def read_times(path: Path) -> dict[str, dict[str, list[float]]]:
    """tag -> {"s": [start per rank], "e": [end per rank]} from the jobs' appended lines."""
    out: dict[str, dict[str, list[float]]] = {}
    try:
        text = path.read_text()
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in ("s", "e"):
            out.setdefault(parts[0], {"s": [], "e": []})[parts[2]].append(float(parts[3]))
    return out


def all_ended(path: Path, ranks: dict[str, int]) -> bool:
    times = read_times(path)
    return all(len(times.get(tag, {}).get("e", ())) >= n for tag, n in ranks.items())


def summarise(submitted: dict[str, float], ranks: dict[str, int], times_path: Path, cpu: dict[str, float],
              submit_s: float, drained: bool) -> dict[str, Any]:
    times = read_times(times_path)
    starts = {t: min(v["s"]) for t, v in times.items() if t in submitted and v["s"]}
    ends = [max(v["e"]) for t, v in times.items() if t in submitted and len(v["e"]) >= ranks[t]]
    first = min(submitted.values())
    wall = max(ends) - first if ends else None
    latency = [(starts[t] - submitted[t]) * 1e3 for t in starts]
    jobs = len(submitted)
    system = {k: v for k, v in cpu.items() if k != "(client)"}
    return {
        "jobs": jobs, "ended": len(ends), "drained": drained, "submit_s": submit_s, "wall_s": wall,
        "jobs_per_s": len(ends) / wall if wall else None,
        "start_p50_ms": percentile(latency, 50) if latency else None,
        "start_p99_ms": percentile(latency, 99) if latency else None,
        "cpu_seconds": cpu, "cpu_ms_per_job": sum(system.values()) / jobs * 1e3,
        "client_cpu_ms_per_job": cpu.get("(client)", 0.0) / jobs * 1e3,
    }


def wait_until(check: Callable[[], bool], timeout: float, every: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(every)
    return check()


# ---- Slurm ----------------------------------------------------------------------------------------

def run_slurm(names: Sequence[str], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    reaper = proc_account.Reaper()
    print(f"starting Slurm ({NODES} slurmd x {GPUS} GPU files{'' if not args.slurm_defaults else ', defaults'}) ...",
          flush=True)
    cluster = slurm_local.start(NODES, GPUS, reaper, tuned=not args.slurm_defaults)
    results: dict[str, Any] = {}
    try:
        for name in names:
            results[name] = slurm_workload(cluster, name, workload(name, args.smoke, args.a_jobs),
                                           work / f"slurm-{name}.times", args.timeout)
            print(f"  {name}: {_brief(results[name])}", flush=True)
    finally:
        cluster.stop()
        reaper.stop()
    return results


def slurm_workload(cluster: slurm_local.SlurmCluster, name: str, jobs: Sequence[Job], times: Path,
                   timeout: float) -> dict[str, Any]:
    script_dir = times.parent
    roots = cluster.pids()
    submitted: dict[str, float] = {}
    ranks: dict[str, int] = {}
    before = proc_account.snapshot(roots, cluster.reaper)

    def sbatch(job: Job) -> None:
        argv = ["sbatch", "--parsable", "-o", "/dev/null", "-J", f"peer-{name}"]
        run = [str(script_dir / "job.sh"), f"{job.seconds:g}", str(times)]
        if job.nodes == 1:
            argv += ["-n1", f"--gres=gpu:{job.gpus}", *run]
        else:  # one job step over every allocated node, a rank per node, as an MPI/DDP job runs
            argv += [f"-N{job.nodes}", "--ntasks-per-node=1", f"--gres=gpu:{job.gpus}",
                     "--wrap", "exec srun --quiet " + " ".join(shlex.quote(a) for a in run)]
        at = time.time()
        tag = cluster.command(*argv).strip().split(";")[0]
        submitted[tag], ranks[tag] = at, job.nodes

    print(f"  slurm {name}: {len(jobs)} jobs ...", flush=True)
    began = time.monotonic()
    with ThreadPoolExecutor(SBATCH_PARALLEL) as pool:
        futures = []
        for job in jobs:
            delay = began + job.offset - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(sbatch, job))
        for f in futures:
            f.result()
    submit_s = time.monotonic() - began
    ended = wait_until(lambda: all_ended(times, ranks), timeout)
    drained = ended and wait_until(lambda: not cluster.command("squeue", "-h", "-o", "%i").split(), 60, every=0.5)
    cpu = proc_account.delta(before, proc_account.snapshot(roots, cluster.reaper))
    return summarise(submitted, ranks, times, cpu, submit_s, drained)


# ---- Corral ---------------------------------------------------------------------------------------

def run_corral(names: Sequence[str], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    print(f"starting Corral ({NODES}x{GPUS}:H100, runtime process) ...", flush=True)
    live = start_stack(f"{NODES}x{GPUS}:H100", runtime="process")
    reaper = proc_account.Reaper()  # after the start: the stack's own start-up waits for its commands
    reaper.owned(list(stack_roots(live)))
    try:
        return asyncio.run(_corral(live, reaper, names, args, work))
    finally:
        reaper.stop()
        live.stop()


async def _corral(live: LiveStack, reaper: proc_account.Reaper, names: Sequence[str], args: argparse.Namespace,
                  work: Path) -> dict[str, Any]:
    client = await Client.connect(live.context)
    results: dict[str, Any] = {}
    try:
        await client.apply_queues(validate_queues({"queues": [{"name": "peer", "guaranteed_gpus": NODES * GPUS}]}))
        await client.wait_for(lambda v: "peer" in v.queues, 30)
        for name in names:
            results[name] = await corral_workload(client, live, reaper, name, workload(name, args.smoke, args.a_jobs),
                                                  work / f"corral-{name}.times", args.timeout)
            print(f"  {name}: {_brief(results[name])}", flush=True)
    finally:
        await client.close()
    return results


async def corral_workload(client: Client, live: LiveStack, reaper: proc_account.Reaper, name: str,
                          jobs: Sequence[Job], times: Path, timeout: float) -> dict[str, Any]:
    script = times.parent / "job.sh"
    base = new_job_id()
    specs = [(f"{base}-{i:05d}", validate_job_spec({
        "name": f"peer-{name}-{i}", "queue": "peer", "replicas": job.nodes, "gpus_per_replica": job.gpus,
        "runtime": "process", "command": ["/bin/bash", str(script), f"{job.seconds:g}", str(times)],
        "workdir": str(times.parent)})) for i, job in enumerate(jobs)]
    ranks = {job_id: job.nodes for (job_id, _), job in zip(specs, jobs, strict=True)}
    submitted: dict[str, float] = {}
    after = await log_position(client)
    roots = stack_roots(live)
    before = proc_account.snapshot(roots, reaper)
    gate = asyncio.Semaphore(256)

    async def one(job_id: str, spec: Any) -> None:
        try:
            submitted[job_id] = time.time()
            await client.submit(spec, job_id=job_id, user="bench")
        finally:
            gate.release()

    print(f"  corral {name}: {len(jobs)} jobs ...", flush=True)
    began = time.monotonic()
    tasks = []
    for (job_id, spec), job in zip(specs, jobs, strict=True):
        delay = began + job.offset - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await gate.acquire()
        tasks.append(asyncio.create_task(one(job_id, spec)))
    await asyncio.gather(*tasks)
    submit_s = time.monotonic() - began
    deadline = time.monotonic() + timeout
    while not all_ended(times, ranks) and time.monotonic() < deadline:
        await asyncio.sleep(0.25)
    _, drained = await wait_placed(client, list(ranks), after, max(1.0, deadline - time.monotonic()),
                                   progress=False, until=("JobCompleted", "JobFailed", "JobCancelled", "JobRejected"))
    cpu = proc_account.delta(before, proc_account.snapshot(roots, reaper))
    result = summarise(submitted, ranks, times, cpu, submit_s, drained)
    result["hops"] = await hops(client, submitted, after, times)
    return result


#: A job's way from its submission to its first rank running, as the log and the job record it:
#: (label, event type, which time of it); "start" is the job script's first line.
HOPS = (("received", "JobSubmitted", "occurred_at"), ("submitted", "JobSubmitted", "recorded_at"),
        ("admitted", "JobAdmitted", "recorded_at"), ("quota", "QuotaReserved", "recorded_at"),
        ("placed", "GangReserved", "recorded_at"), ("start", "", ""),
        ("worker started", "WorkerStarted", "occurred_at"), ("recorded", "WorkerStarted", "recorded_at"),
        ("running", "JobRunning", "recorded_at"))


async def hops(client: Client, submitted: dict[str, float], after: int, times: Path) -> list[dict[str, Any]]:
    """Per step of `HOPS`: p50 / p99 ms from the submission and from the step before (Corral's jobs)."""
    marks: dict[str, dict[str, float]] = {job_id: {} for job_id in submitted}
    streams = {f"job-{job_id}": job_id for job_id in submitted}
    position = after
    while batch := await client.store.read_all(position, limit=10000):
        position = batch[-1].position
        for stored in batch:
            job_id = streams.get(stored.stream)
            if job_id is None:
                continue
            for label, kind, attr in HOPS:  # each the first of its kind (a job's first attempt)
                if kind == stored.type and label not in marks[job_id]:
                    marks[job_id][label] = getattr(stored, attr).timestamp()
    for tag, v in read_times(times).items():
        if tag in marks and v["s"]:
            marks[tag]["start"] = min(v["s"])
    out = []
    before = None
    for label, _, _ in HOPS:
        total = [(m[label] - submitted[j]) * 1e3 for j, m in marks.items() if label in m]
        step = [(m[label] - m[before]) * 1e3 for j, m in marks.items() if label in m and before in m] \
            if before is not None else total
        if total and step:
            out.append({"hop": label, "p50": percentile(total, 50), "p99": percentile(total, 99),
                        "step_p50": percentile(step, 50), "step_p99": percentile(step, 99)})
        before = label
    return out


# ---- the table ------------------------------------------------------------------------------------

def _brief(r: dict[str, Any]) -> str:
    wall = f"{r['wall_s']:.1f}s" if r["wall_s"] is not None else "-"
    return f"{r['ended']}/{r['jobs']} ended, wall {wall}, {r['cpu_ms_per_job']:.1f} ms CPU per job"


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Corral / Slurm per workload and figure (None where either is missing)."""
    out: dict[str, dict[str, float | None]] = {}
    slurm, corral = results.get("slurm", {}), results.get("corral", {})
    for name in slurm.keys() & corral.keys():
        s, c = slurm[name], corral[name]
        row: dict[str, float | None] = {}
        for key, short in (("wall_s", "wall"), ("jobs_per_s", "jobs_per_s"), ("start_p50_ms", "start_p50"),
                           ("start_p99_ms", "start_p99"), ("cpu_ms_per_job", "cpu")):
            row[short] = c[key] / s[key] if c.get(key) is not None and s.get(key) else None
        out[name] = row
    return out


def _f(value: float | None, fmt: str) -> str:
    return format(value, fmt) if value is not None else "-"


def render(result: dict[str, Any]) -> str:
    lines = [f"machine: {machine_line()}", f"command: {result['command']}", f"date:    {result['date']}",
             f"slurm:   22.05 from Debian, {NODES} slurmd x {GPUS} GPU files, SchedulerParameters="
             f"{'(defaults)' if result['slurm_defaults'] else slurm_local.TUNED}",
             f"corral:  {NODES}x{GPUS}:H100, runtime process; both: every job a bash script around /bin/sleep", "",
             f"{'system':<13} {'jobs':>5} {'wall s':>8} {'jobs/s':>7} {'start p50':>10} "
             f"{'p99 ms':>8} {'CPU ms/job':>11} {'client':>7}"]
    results, rat = result["results"], result["ratios"]
    for name in result["workloads"]:
        lines.append(f"{name}: {DESCRIBED[name]}" + (" (smoke size)" if result["smoke"] else ""))
        for system in ("slurm", "corral"):
            r = results.get(system, {}).get(name)
            if r is None:
                continue
            lines.append(f"{system:<13} {r['jobs']:>5} {_f(r['wall_s'], '8.1f')} "
                         f"{_f(r['jobs_per_s'], '7.1f')} {_f(r['start_p50_ms'], '10.0f')} "
                         f"{_f(r['start_p99_ms'], '8.0f')} {r['cpu_ms_per_job']:11.1f} "
                         f"{r['client_cpu_ms_per_job']:7.1f}" + ("" if r["drained"] else "  (did not finish)"))
        if name in rat:
            q = rat[name]
            lines.append(f"{'corral/slurm':<13} {'':>5} {_f(q['wall'], '7.2f')}x "
                         f"{_f(q['jobs_per_s'], '6.2f')}x {_f(q['start_p50'], '9.2f')}x {_f(q['start_p99'], '7.2f')}x "
                         f"{_f(q['cpu'], '10.2f')}x")
    lines += ["", "CPU ms per job by process (client apart; slurmstepd and Corral's node-agents include the jobs):"]
    for name in result["workloads"]:
        for system in ("slurm", "corral"):
            r = results.get(system, {}).get(name)
            if r is not None:
                parts = ", ".join(f"{k} {v / r['jobs'] * 1e3:.1f}" for k, v in r["cpu_seconds"].items()
                                  if k != "(client)" and v / r["jobs"] * 1e3 >= 0.05)
                lines.append(f"  {name:<3} {system:<7} {r['cpu_ms_per_job']:6.1f} = {parts}")
    for name in result["workloads"]:
        steps = results.get("corral", {}).get(name, {}).get("hops")
        if steps and name == "L":
            lines += ["", f"Corral {name}: submit -> ... p50 / p99 ms from the submission (and from the step before):"]
            lines += [f"  {h['hop']:<15} {h['p50']:7.1f} / {h['p99']:7.1f}   (+{h['step_p50']:6.1f} / "
                      f"{h['step_p99']:6.1f})" for h in steps]
    verdicts = acceptance(rat)
    if verdicts:
        lines += ["", "acceptance (figures of this run):", *verdicts]
    return "\n".join(lines)


def acceptance(rat: dict[str, dict[str, float | None]]) -> list[str]:
    out = []
    for name, (figure, limit) in TARGETS.items():
        value = rat.get(name, {}).get(figure)
        if value is not None:
            out.append(f"  {name} {figure} ratio {value:.2f} <= {limit} -> {'MET' if value <= limit else 'MISSED'}")
    name, limit = CPU_TARGET
    value = rat.get(name, {}).get("cpu")
    if value is not None:
        out.append(f"  {name} CPU per job ratio {value:.2f} <= {limit} -> {'MET' if value <= limit else 'MISSED'}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="A,B1,B2,L", help="comma list of A, B1, B2, L (default all)")
    parser.add_argument("--systems", default="slurm,corral", help="comma list of slurm, corral (default both)")
    parser.add_argument("--slurm-defaults", action="store_true", help="Slurm without the high-throughput tuning")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per workload after submitting")
    parser.add_argument("--work-dir", type=Path, help="where the job scripts and times files go (default: a temp dir)")
    parser.add_argument("--json", type=Path, help="write the figures as JSON here")
    parser.add_argument("--smoke", action="store_true", help="tiny workloads checking the script end to end")
    parser.add_argument("--a-jobs", type=int, help="jobs of workload A (default 2,000; 20 with --smoke)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    for n in names:
        workload(n, args.smoke)
    if "slurm" in systems and (missing := slurm_local.missing_programs()):
        print(f"Slurm is not installed here (missing: {', '.join(missing)}): {slurm_local.INSTALL_HINT}",
              file=sys.stderr)
        return 2
    if args.smoke:
        args.timeout = min(args.timeout, 300.0)  # a loaded CI machine: the smoke checks the script, not speed
    import tempfile
    work = (args.work_dir or Path(tempfile.mkdtemp(prefix="corral-peer-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o755)
    (work / "job.sh").write_text(JOB_SCRIPT)
    (work / "job.sh").chmod(0o755)
    print(f"machine: {machine_line()}", flush=True)
    results: dict[str, Any] = {}
    try:
        if "slurm" in systems:
            results["slurm"] = run_slurm(names, args, work)
        if "corral" in systems:
            results["corral"] = run_corral(names, args, work)
    finally:
        if args.work_dir is None:  # the job script and the jobs' times files: kept only when asked
            shutil.rmtree(work, ignore_errors=True)
    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", "bench/peer_slurm.py", *sys.argv[1:]])
    return report({"command": command, "workloads": names, "smoke": args.smoke,
                   "slurm_defaults": args.slurm_defaults, "results": results, "ratios": ratios(results)},
                  args.json, render)


if __name__ == "__main__":
    sys.exit(main())
