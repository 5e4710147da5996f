"""`corral jobs` with a backlog: the page it shows by default against every row, as whole processes.

A stack (`corral up`'s, 4 x 8 H100, runtime `sim-timer`) is filled with day-long 8-GPU jobs (4
run, the rest wait: `--size 20000` is 19,996 pending); then each listing runs `--runs` times as
a fresh process, timed from fork to exit with the CPU it used (`bench/cli.py`'s `timed`):

- `corral jobs`: the oldest 100 and a line saying how many more match (the default);
- `corral jobs --limit 0`: every row, unpaged;
- `corral jobs --json`: every row as JSON (scripts get every match unless they pass --limit);
- `corral jobs --user nobody`: an empty answer, i.e. the read and the selection alone;
- `corral --help`: the interpreter and the CLI's imports (the floor of every command).

Run: .venv/bin/python bench/jobs_page.py [--size 20000] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

from cli import CORRAL, fill, timed, wait_quiet
from live import LiveStack, log_position, machine_line, percentile, start_stack, wait_placed

from corral.client import Client, new_job_id
from corral.contracts.queues import validate_queues

LISTINGS = (["jobs"], ["jobs", "--limit", "0"], ["jobs", "--json"], ["jobs", "--user", "nobody"], ["--help"])


async def fill_to(live: LiveStack, size: int) -> None:
    c = await Client.connect(live.context)
    try:
        await c.apply_queues(validate_queues({"queues": [{"name": "bench", "guaranteed_gpus": 32}]}))
        await c.wait_for(lambda v: "bench" in v.queues, 30)
        after = await log_position(c)
        began = time.monotonic()
        ids = await fill(c, size, new_job_id(), 0)
        await wait_placed(c, ids, after, 1200, until=("JobAdmitted", "JobRejected"))
        print(f"filled {size} jobs in {time.monotonic() - began:.0f}s", flush=True)
    finally:
        await c.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=20000, help="jobs on the stack (default 20000)")
    parser.add_argument("--runs", type=int, default=5, help="runs of each listing (default 5)")
    parser.add_argument("--smoke", action="store_true",
                        help="the test suite's size (200 jobs, one run each): checks the script, not the speed")
    args = parser.parse_args()
    if args.smoke:
        args.size, args.runs = 200, 1
    print(f"machine: {machine_line()}", flush=True)
    live = start_stack("4x8:H100", runtime="sim-timer")
    try:
        asyncio.run(fill_to(live, args.size))
        print(f"stack quiet after {wait_quiet(live, 0.25, 300):.0f}s", flush=True)
        env = {**os.environ, "CORRAL_CONTEXT": str(live.data_dir), "COLUMNS": "120"}
        for argv in LISTINGS:
            walls, cpus = [], []
            for _ in range(args.runs):
                wall, cpu, code, err, _ = timed([str(CORRAL), *argv], env, live.data_dir)
                if code != 0:
                    raise RuntimeError(f"corral {' '.join(argv)} exited {code}: {err}")
                walls.append(wall)
                cpus.append(cpu)
            print(f"corral {' '.join(argv):<22} p50 {percentile(walls, 50):7.0f} ms  "
                  f"p90 {percentile(walls, 90):7.0f} ms"
                  f"  CPU p50 {percentile(cpus, 50):6.0f} ms", flush=True)
    finally:
        live.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
