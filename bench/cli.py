"""What a person waits for: whole `corral` processes timed, as a shell runs them, against a live stack.

A stack (`corral up`'s, 4 x 8 H100, runtime `sim-timer`) is filled with jobs of 8 GPUs that run
for a day: 4 run, the rest wait, so a size of 20,000 is 19,996 pending. At each size the bench
runs each command `--runs` times as a fresh process (`.venv/bin/corral ...`, the context of the
stack, output to a pipe that is read and dropped) and times it from fork to exit, with the CPU the
process used (its rusage), how long it waited for a core (its run-queue delay) and the rest, the
time it was blocked on the stack, and the stack's CPU per run by process:

- submit: `corral submit spec.yaml`, which waits for admission's verdict (a new job each run);
- jobs:   `corral jobs` (every job not ended: the whole table);
- show:   `corral show JOB` of a pending job;
- cancel: `corral cancel JOB` of a different pending job each run;
- help:   `corral --help`, the interpreter and the CLI's imports alone (the floor of the others).

For `submit` and `cancel` it reads where the wait went from the log: the request made (its event
id's time), taken by admission, its verdict recorded, the process's exit (`verdict_waits`). With
`--profile-dir D` each service writes a cProfile of each command's runs alone to D.

Targets (against sbatch's cost): submit p50 <= 150 ms, jobs <= 150 ms at 1,000 jobs and
<= 500 ms at 20,000 pending, cancel <= 150 ms. sbatch on the same machine: ~10 ms.

Run: .venv/bin/python bench/cli.py [--sizes 1000,20000] [--runs 10] [--json FILE] [--smoke]
     [--profile-dir D]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from live import (
    LiveStack,
    _log_after,
    cpu_delta,
    log_position,
    machine_line,
    percentile,
    report,
    stack_cpu,
    stack_roots,
    start_stack,
    wait_placed,
)

from corral.client import Client, new_job_id
from corral.contracts import events as ev
from corral.contracts.envelope import event_id_time
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.queues import validate_queues
from corral.contracts.registry import decode

CORRAL = Path(sys.executable).with_name("corral")
TARGETS_MS = {"submit": {None: 150.0}, "cancel": {None: 150.0}, "jobs": {1000: 150.0, 20000: 500.0}}
COMMANDS = ("help", "submit", "jobs", "show", "cancel")
JOB = {"queue": "bench", "gpus_per_replica": 8, "runtime": "sim", "duration_seconds": 86400}


def target(command: str, size: int) -> float | None:
    by_size = TARGETS_MS.get(command, {})
    return by_size.get(size, by_size.get(None))


def timed(argv: Sequence[str], env: dict[str, str], cwd: Path) -> tuple[float, float, int, str, float]:
    """(wall ms, CPU ms, exit code, stderr's end, ms it waited for a core) of one whole process.

    The wait for a core is the kernel's run-queue delay of the process's main thread
    (`/proc/PID/schedstat`, read once it has exited and before it is reaped): what it lost to
    other processes on a busy machine, as against what it waited on the stack (blocked)."""
    began = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read()
    err = proc.stderr.read()
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    try:
        runq = int(Path(f"/proc/{proc.pid}/schedstat").read_text().split()[1]) / 1e6
    except (OSError, IndexError, ValueError):
        runq = float("nan")
    _, status, usage = os.wait4(proc.pid, 0)
    wall = (time.perf_counter() - began) * 1e3
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stdout.close()
    proc.stderr.close()
    return wall, (usage.ru_utime + usage.ru_stime) * 1e3, proc.returncode, err.decode(errors="replace")[-600:], runq


async def fill(client: Client, count: int, base: str, start: int) -> list[str]:
    """Submit `count` day-long 8-GPU jobs; their ids."""
    spec = validate_job_spec({"name": "cli-bench", **JOB})
    ids = [f"{base}-{i:05d}" for i in range(start, start + count)]
    gate = asyncio.Semaphore(256)

    async def one(job_id: str) -> None:
        try:
            await client.submit(spec, job_id=job_id, user="bench")
        finally:
            gate.release()

    tasks = []
    for job_id in ids:
        await gate.acquire()
        tasks.append(asyncio.create_task(one(job_id)))
    await asyncio.gather(*tasks)
    return ids


def wait_quiet(live: LiveStack, cores: float = 0.25, timeout: float = 120.0) -> float:
    """Wait until the stack uses less than `cores` over a second (what the fill started is done)."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        before = sum(stack_cpu(live).values())
        time.sleep(1.0)
        if sum(stack_cpu(live).values()) - before < cores:
            break
    return time.monotonic() - began


def profile_window(live: LiveStack) -> None:
    """With `--profile-dir`: each service writes its profile so far and starts a new one
    (`corral.profiling`), so that a window's profile holds one command's runs alone."""
    if os.environ.get("CORRAL_PROFILE_DIR"):
        for pid, name in stack_roots(live).items():
            if name not in ("nats-server", "postgres"):
                os.kill(pid, signal.SIGUSR1)
        time.sleep(0.5)


def measure(size: int, runs: int, pending: list[str], live: LiveStack, spec_file: Path,
            commands: Sequence[str] = COMMANDS) -> dict[str, Any]:
    # As an installed CLI runs: its modules' bytecode cached (a shell that sets
    # PYTHONDONTWRITEBYTECODE would compile every module from source on every call).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(CORRAL_CONTEXT=str(live.data_dir), COLUMNS="120")
    out: dict[str, Any] = {}
    for command in commands:
        walls, cpus, ends, runqs = [], [], [], []
        profile_window(live)
        before = stack_cpu(live)
        for i in range(-1, runs):  # run -1 writes the bytecode and warms the page cache: not counted
            argv = {"help": [str(CORRAL), "--help"], "submit": [str(CORRAL), "submit", str(spec_file)],
                    "jobs": [str(CORRAL), "jobs"], "show": [str(CORRAL), "show", pending[0]],
                    "cancel": [str(CORRAL), "cancel", pending[-2 - i]]}[command]
            wall, cpu, code, err, runq = timed(argv, env, live.data_dir)
            if code != 0:
                raise RuntimeError(f"{' '.join(argv[1:])} exited {code}: {err}")
            if i >= 0:
                walls.append(wall)
                cpus.append(cpu)
                runqs.append(runq)
                ends.append(time.time())
        stack = cpu_delta(before, stack_cpu(live))
        profile_window(live)
        blocked = [w - c - q for w, c, q in zip(walls, cpus, runqs, strict=True)]
        r = out[command] = {"runs": runs, "p50_ms": percentile(walls, 50), "p90_ms": percentile(walls, 90),
                            "cpu_p50_ms": percentile(cpus, 50), "target_ms": target(command, size),
                            "runq_p50_ms": percentile(runqs, 50), "blocked_p50_ms": percentile(blocked, 50),
                            "ended_at": ends, "stack_cpu_ms_per_run": {k: round(v * 1e3 / (runs + 1), 1)
                                                                       for k, v in stack.items() if v > 0}}
        print(f"    {command:<7} p50 {r['p50_ms']:7.0f} ms  p90 {r['p90_ms']:7.0f} ms  "
              f"CPU p50 {r['cpu_p50_ms']:6.0f} ms  waiting for a core {r['runq_p50_ms']:5.0f} ms  "
              f"blocked {r['blocked_p50_ms']:5.0f} ms", flush=True)
    return out


async def verdict_waits(client: Client, after: int, ended: Sequence[float]) -> dict[str, float]:
    """Where a `submit` / `cancel` run's wait went, from the log after `after` (the runs' requests
    and verdicts; the first run, uncounted, dropped): p50 ms from the request's making (its event
    id's time, the CLI's clock: before the CLI connects to NATS) to admission's taking it (a
    submission's `occurred_at`) or its decision (a cancellation's JobCancelled `occurred_at`), to
    the verdict's `recorded_at`, and from there to the process's exit (`ended`: the verdict read,
    the printing, the interpreter's exit)."""
    made: dict[str, datetime] = {}
    taken: dict[str, datetime] = {}
    recorded: dict[str, datetime] = {}
    async for stored in _log_after(client, after):
        if stored.type in ("JobSubmitted", "JobCancelRequested"):
            event = decode(stored.data)
            if isinstance(event, ev.JobSubmitted) and event.spec.name != "cli-submit":
                continue
            made[stored.stream] = event_id_time(event.event_id)
            if isinstance(event, ev.JobSubmitted):
                taken[stored.stream] = event.occurred_at
        elif stored.type in ("JobAdmitted", "JobRejected", "JobCancelled") and stored.stream in made:
            recorded.setdefault(stored.stream, stored.recorded_at)
            if stored.type == "JobCancelled":
                taken.setdefault(stored.stream, decode(stored.data).occurred_at)
    streams = [s for s in made if s in recorded][1:]
    ms = lambda a, b: (b - a).total_seconds() * 1e3  # noqa: E731
    return {"made_to_taken_ms": percentile([ms(made[s], taken[s]) for s in streams], 50),
            "taken_to_recorded_ms": percentile([ms(taken[s], recorded[s]) for s in streams], 50),
            "made_to_recorded_ms": percentile([ms(made[s], recorded[s]) for s in streams], 50),
            "recorded_to_exit_ms": percentile([e * 1e3 - recorded[s].timestamp() * 1e3
                                              for s, e in zip(streams, ended, strict=False)], 50)}


async def run(args: argparse.Namespace, live: LiveStack, spec_file: Path) -> dict[str, Any]:
    client = await Client.connect(live.context)
    results: dict[str, Any] = {}
    try:
        await client.apply_queues(validate_queues({"queues": [{"name": "bench", "guaranteed_gpus": 32}]}))
        await client.wait_for(lambda v: "bench" in v.queues, 30)
        base, ids, made = new_job_id(), [], 0
        for size in args.sizes:
            after = await log_position(client)
            print(f"  filling to {size} jobs ...", flush=True)
            new = await fill(client, size - len(ids), base, made)
            made += len(new)
            await wait_placed(client, new, after, args.timeout, until=("JobAdmitted", "JobRejected"))
            ids += new
            quiet = await asyncio.to_thread(wait_quiet, live)
            print(f"  {size} jobs ({size - 4} pending), stack quiet after {quiet:.0f}s; timing {args.runs} runs each",
                  flush=True)
            results[str(size)] = {}
            for command in COMMANDS:
                after = await log_position(client)
                out = await asyncio.to_thread(measure, size, args.runs, ids[4:], live, spec_file, [command])
                if command in ("submit", "cancel"):
                    out[command]["verdict"] = await verdict_waits(client, after, out[command]["ended_at"])
                    print("            verdict p50 ms: " + ", ".join(f"{k.removesuffix('_ms')} {v:.1f}" for k, v in
                                                                    out[command]["verdict"].items()), flush=True)
                print("            stack CPU ms per run: " + ", ".join(
                    f"{k} {v:.0f}" for k, v in out[command]["stack_cpu_ms_per_run"].items()), flush=True)
                results[str(size)].update(out)
            ids = ids[:len(ids) - args.runs - 1]  # the cancelled ones (each submit run adds one)
    finally:
        await client.close()
    return results


def render(result: dict[str, Any]) -> str:
    lines = [f"machine: {machine_line()}", f"command: {result['command']}", f"date:    {result['date']}",
             "stack:   4x8:H100, sim-timer; day-long 8-GPU jobs (4 run, the rest pending); each run a fresh process",
             "", f"{'jobs':>6}  {'command':<8} {'runs':>4} {'p50 ms':>8} {'p90 ms':>8} {'CPU p50 ms':>11} "
                 f"{'core wait':>10} {'blocked':>8} {'stack CPU':>10}  target"]
    waits = []
    for size, commands in result["sizes"].items():
        for command, r in commands.items():
            goal = r["target_ms"]
            verdict = "" if goal is None else f"<= {goal:.0f} ms p50 -> {'MET' if r['p50_ms'] <= goal else 'MISSED'}"
            lines.append(f"{size:>6}  {command:<8} {r['runs']:>4} {r['p50_ms']:8.0f} {r['p90_ms']:8.0f} "
                         f"{r['cpu_p50_ms']:11.0f} {r['runq_p50_ms']:10.0f} {r['blocked_p50_ms']:8.0f} "
                         f"{sum(r['stack_cpu_ms_per_run'].values()):10.0f}  {verdict}")
            if "verdict" in r:
                waits.append(f"{size:>6}  {command:<8} " + ", ".join(
                    f"{k.removesuffix('_ms').replace('_', ' ')} {v:.1f}" for k, v in r["verdict"].items()))
    return "\n".join([*lines, "", "(ms p50; core wait: the process's run-queue delay; blocked: wall - CPU - core "
                       "wait; stack CPU: the stack's, per run)", "verdicts, ms p50:", *waits])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1000, 20000],
                        help="jobs on the stack at each measurement, increasing (default 1000,20000)")
    parser.add_argument("--runs", type=int, default=10, help="runs of each command at each size (default 10)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for a fill to be admitted")
    parser.add_argument("--data-dir", type=Path, help="keep the stack's data and logs here")
    parser.add_argument("--json", type=Path, help="write the figures as JSON here")
    parser.add_argument("--smoke", action="store_true", help="a tiny run checking the script end to end")
    parser.add_argument("--profile-dir", type=Path,
                        help="the services' cProfiles here (CORRAL_PROFILE_DIR), a file per command's runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.sizes, args.runs = [20], 2
    if sorted(args.sizes) != args.sizes or args.sizes[0] <= 5 + args.runs:
        parser.error("--sizes must increase and leave pending jobs to cancel")
    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", "bench/cli.py", *sys.argv[1:]])
    print(f"machine: {machine_line()}", flush=True)
    if args.profile_dir is not None:
        os.environ["CORRAL_PROFILE_DIR"] = str(args.profile_dir.resolve())
    live = start_stack("4x8:H100", runtime="sim-timer", data_dir=args.data_dir)
    spec_file = live.data_dir / "cli-bench-job.yaml"
    spec_file.write_text("".join(f"{k}: {v}\n" for k, v in {"name": "cli-submit", **JOB}.items()))
    try:
        sizes = asyncio.run(run(args, live, spec_file))
    finally:
        live.stop()
    return report({"command": command, "sizes": sizes}, args.json, render)


if __name__ == "__main__":
    sys.exit(main())
