"""What one gang costs the node agent's side, per gang: `python bench/stepd_cost.py [--gangs N]`.

Drives the real `Supervisor` and its stepd launcher (the fork server) with one-rank gangs of
`/bin/true` (`--command` for another), `--at-once` at a time, and prints per gang: the CPU of this
process (the agent's part: folders, launch.json, the launcher request, the watcher, the reports)
and of the launcher process with everything it reaped (the stepds and the jobs; its own apart), its minor page
faults, and the inodes left per gang in the run folder. CPU from getrusage and /proc/<pid>/stat
(utime + stime + cutime + cstime), so a loaded machine shows up as spread, not as more CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.machine_probe import probe_line
from corral.services.node_agent.process.assignment import Assignment, RankAssignment
from corral.services.node_agent.process.supervisor import GangOutcome, Supervisor

TICK = os.sysconf("SC_CLK_TCK")


class Quiet:
    async def worker_started(self, *args: Any, **kwargs: Any) -> None: ...

    async def worker_exited(self, *args: Any, **kwargs: Any) -> None: ...

    async def checkpoint_done(self, *args: Any, **kwargs: Any) -> None: ...

    async def gang_ended(self, outcome: GangOutcome) -> None: ...


def proc_cost(pid: int) -> tuple[float, int, float]:
    """(CPU seconds, minor faults) of `pid` and its reaped children, and its own CPU seconds."""
    raw = Path(f"/proc/{pid}/stat").read_bytes()
    f = raw[raw.rfind(b")") + 2:].split()
    minflt, cminflt = int(f[7]), int(f[8])
    ticks = sum(int(x) for x in f[11:15])
    return ticks / TICK, minflt + cminflt, (int(f[11]) + int(f[12])) / TICK


def launcher_pid(sup: Supervisor) -> int | None:
    return sup._launcher.pid


async def run(gangs: int, at_once: int, command: tuple[str, ...], root: Path) -> dict[str, float]:
    sup = Supervisor(Quiet(), root / "run", base_env={"PATH": "/usr/bin:/bin"})

    def assignment(n: int) -> Assignment:
        return Assignment(job_id=f"g{n}", attempt=0, world_size=1, node_rank=0, master_addr="127.0.0.1",
                          master_port=29500, ranks=(RankAssignment(0, 0, (0,)),), command=command,
                          checkpoint_dir=root / "ckpt" / f"g{n}", log_dir=root / "logs")

    await sup.start(assignment(-1))  # warm: the launcher runs, imports are done
    await sup.wait("g-1")
    pid = launcher_pid(sup)
    assert pid is not None
    before_self = resource.getrusage(resource.RUSAGE_SELF)
    before_l = proc_cost(pid)
    started = time.monotonic()
    sem = asyncio.Semaphore(at_once)

    async def one(n: int) -> None:
        async with sem:
            await sup.start(assignment(n), wait=False)
            await sup.wait(f"g{n}")

    await asyncio.gather(*(one(n) for n in range(gangs)))
    wall = time.monotonic() - started
    after_l = proc_cost(pid)
    after_self = resource.getrusage(resource.RUSAGE_SELF)
    await sup.close()
    names = list((root / "run").rglob("*"))
    inodes = len({p.lstat().st_ino for p in names}) / (gangs + 1)  # a hard link is a name, not an inode
    agent = (after_self.ru_utime + after_self.ru_stime - before_self.ru_utime - before_self.ru_stime)
    return {"gangs": gangs, "wall_s": wall, "agent_ms": 1000 * agent / gangs,
            "launcher_ms": 1000 * (after_l[0] - before_l[0]) / gangs,
            "launcher_own_ms": 1000 * (after_l[2] - before_l[2]) / gangs,
            "launcher_faults": (after_l[1] - before_l[1]) / gangs, "run_entries": len(names) / (gangs + 1),
            "run_inodes": inodes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gangs", type=int, default=300)
    parser.add_argument("--at-once", type=int, default=40)
    parser.add_argument("--command", default="/bin/true")
    parser.add_argument("--smoke", action="store_true", help="a tiny run (seconds) checking the script end to end")
    args = parser.parse_args()
    if args.smoke:
        args.gangs, args.at_once = 6, 3
    print(probe_line())
    with tempfile.TemporaryDirectory() as tmp:
        r = asyncio.run(run(args.gangs, args.at_once, tuple(args.command.split()), Path(tmp)))
    print(f"{r['gangs']} gangs in {r['wall_s']:.1f}s: agent {r['agent_ms']:.2f} ms/gang, launcher+stepds+jobs "
          f"{r['launcher_ms']:.2f} ms/gang (its own {r['launcher_own_ms']:.2f}), "
          f"{r['launcher_faults']:.0f} faults/gang, "
          f"{r['run_entries']:.1f} run-folder entries/gang ({r['run_inodes']:.1f} inodes)")
    print(probe_line())


if __name__ == "__main__":
    main()
