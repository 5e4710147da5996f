"""What a person waits for: whole `corral` processes timed, as a shell runs them, against a live stack.

A stack (`corral up`'s, 4 x 8 H100, runtime `sim-timer`) is filled with jobs of 8 GPUs that run
for a day: 4 run, the rest wait, so a size of 20,000 is 19,996 pending. At each size the bench
runs each command `--runs` times as a fresh process (`.venv/bin/corral ...`, the context of the
stack, output to a pipe that is read and dropped) and times it from fork to exit, with the CPU the
process used (its rusage):

- submit: `corral submit spec.yaml`, which waits for admission's verdict (a new job each run);
- jobs:   `corral jobs` (every job not ended: the whole table);
- show:   `corral show JOB` of a pending job;
- cancel: `corral cancel JOB` of a different pending job each run;
- help:   `corral --help`, the interpreter and the CLI's imports alone (the floor of the others).

Targets (against sbatch's cost): submit p50 <= 150 ms, jobs <= 150 ms at 1,000 jobs and
<= 500 ms at 20,000 pending, cancel <= 150 ms. sbatch on the same machine: ~10 ms.

Run: .venv/bin/python bench/cli.py [--sizes 1000,20000] [--runs 10] [--json FILE] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from live import LiveStack, log_position, machine_line, percentile, report, stack_cpu, start_stack, wait_placed

from corral.client import Client, new_job_id
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.queues import validate_queues

CORRAL = Path(sys.executable).with_name("corral")
TARGETS_MS = {"submit": {None: 150.0}, "cancel": {None: 150.0}, "jobs": {1000: 150.0, 20000: 500.0}}
COMMANDS = ("help", "submit", "jobs", "show", "cancel")
JOB = {"queue": "bench", "gpus_per_replica": 8, "runtime": "sim", "duration_seconds": 86400}


def target(command: str, size: int) -> float | None:
    by_size = TARGETS_MS.get(command, {})
    return by_size.get(size, by_size.get(None))


def timed(argv: Sequence[str], env: dict[str, str], cwd: Path) -> tuple[float, float, int, str]:
    """(wall ms, CPU ms, exit code, stderr's end) of one whole process."""
    began = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = (time.perf_counter() - began) * 1e3
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stdout.close()
    proc.stderr.close()
    return wall, (usage.ru_utime + usage.ru_stime) * 1e3, proc.returncode, err.decode(errors="replace")[-600:]


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


def measure(size: int, runs: int, pending: list[str], live: LiveStack, spec_file: Path) -> dict[str, Any]:
    # As an installed CLI runs: its modules' bytecode cached (a shell that sets
    # PYTHONDONTWRITEBYTECODE would compile every module from source on every call).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(CORRAL_CONTEXT=str(live.data_dir), COLUMNS="120")
    out: dict[str, Any] = {}
    for command in COMMANDS:
        walls, cpus = [], []
        for i in range(-1, runs):  # run -1 writes the bytecode and warms the page cache: not counted
            argv = {"help": [str(CORRAL), "--help"], "submit": [str(CORRAL), "submit", str(spec_file)],
                    "jobs": [str(CORRAL), "jobs"], "show": [str(CORRAL), "show", pending[0]],
                    "cancel": [str(CORRAL), "cancel", pending[-2 - i]]}[command]
            wall, cpu, code, err = timed(argv, env, live.data_dir)
            if code != 0:
                raise RuntimeError(f"{' '.join(argv[1:])} exited {code}: {err}")
            if i >= 0:
                walls.append(wall)
                cpus.append(cpu)
        out[command] = {"runs": runs, "p50_ms": percentile(walls, 50), "p90_ms": percentile(walls, 90),
                        "cpu_p50_ms": percentile(cpus, 50), "target_ms": target(command, size)}
        print(f"    {command:<7} p50 {out[command]['p50_ms']:7.0f} ms  p90 {out[command]['p90_ms']:7.0f} ms  "
              f"CPU p50 {out[command]['cpu_p50_ms']:6.0f} ms", flush=True)
    return out


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
            results[str(size)] = await asyncio.to_thread(measure, size, args.runs, ids[4:], live, spec_file)
            ids = ids[:len(ids) - args.runs - 1]  # the cancelled ones (each submit run adds one)
    finally:
        await client.close()
    return results


def render(result: dict[str, Any]) -> str:
    lines = [f"machine: {machine_line()}", f"command: {result['command']}", f"date:    {result['date']}",
             "stack:   4x8:H100, sim-timer; day-long 8-GPU jobs (4 run, the rest pending); each run a fresh process",
             "", f"{'jobs':>6}  {'command':<8} {'runs':>4} {'p50 ms':>8} {'p90 ms':>8} {'CPU p50 ms':>11}  target"]
    for size, commands in result["sizes"].items():
        for command, r in commands.items():
            goal = r["target_ms"]
            verdict = "" if goal is None else f"<= {goal:.0f} ms p50 -> {'MET' if r['p50_ms'] <= goal else 'MISSED'}"
            lines.append(f"{size:>6}  {command:<8} {r['runs']:>4} {r['p50_ms']:8.0f} {r['p90_ms']:8.0f} "
                         f"{r['cpu_p50_ms']:11.0f}  {verdict}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1000, 20000],
                        help="jobs on the stack at each measurement, increasing (default 1000,20000)")
    parser.add_argument("--runs", type=int, default=10, help="runs of each command at each size (default 10)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for a fill to be admitted")
    parser.add_argument("--data-dir", type=Path, help="keep the stack's data and logs here")
    parser.add_argument("--json", type=Path, help="write the figures as JSON here")
    parser.add_argument("--smoke", action="store_true", help="a tiny run checking the script end to end")
    args = parser.parse_args(argv)
    if args.smoke:
        args.sizes, args.runs = [20], 2
    if sorted(args.sizes) != args.sizes or args.sizes[0] <= 5 + args.runs:
        parser.error("--sizes must increase and leave pending jobs to cancel")
    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", "bench/cli.py", *sys.argv[1:]])
    print(f"machine: {machine_line()}", flush=True)
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
