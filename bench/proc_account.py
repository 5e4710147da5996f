"""CPU seconds by process name, short-lived processes included: what a system costs per job.

Why: a scheduler's per-job work happens largely in processes that live for one job
(Slurm's slurmstepd, Corral's stepd, the job's own shell). Sampling /proc sees only what is alive
at the sample; a process that ended is gone from it. Two things keep its CPU:
- a parent that waits for its child adds the child's whole CPU to its own `cutime` / `cstime`
  (/proc/PID/stat fields 16-17): the agent's stepds, Postgres's backends, slurmstepd's job;
- a daemon's double fork leaves the grandchild to the nearest "child subreaper" ancestor
  (prctl PR_SET_CHILD_SUBREAPER), here the benchmark itself, which reaps it and keeps its
  rusage under its name (`Reaper`). Without it slurmstepd would go to init and its CPU nowhere.

A snapshot sums utime + stime + cutime + cstime of every process below the benchmark: a root (a
process the caller named, e.g. "slurmctld" or "node-agents") has its own CPU under its name and
its descendants' (alive, or waited for: its cutime) under "NAME children" (the agent's stepds and
their jobs; Postgres's backends); a process not below a root goes under the command name of its
ancestor that is the benchmark's direct child (a reparented slurmstepd and the job below it:
"slurmstepd"). The difference of two snapshots plus what the reaper reaped in between is the CPU
each part used, the ended included.
"""

from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import threading
import time
from collections.abc import Sequence

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux); False where it cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _stat(pid: int) -> tuple[str, int, float, float] | None:
    """(command name, parent pid, its own CPU seconds, its waited-for children's) of `pid`."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    name = text[text.index("(") + 1:text.rindex(")")]
    fields = text.rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return name, int(fields[1]), (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


class Reaper:
    """Reaps every ended child of this process, except the ones it is told another waiter owns
    (`spawn`'s subprocesses, the stack's Popen children), and keeps their CPU by name.

    A thread polls `waitid(..., WNOWAIT)` to learn a zombie's pid before reaping it, so its name is
    still readable in /proc; `os.wait4` then gives its rusage (its own and its waited children's).
    """

    def __init__(self, poll: float = 0.02) -> None:
        self.subreaper = become_subreaper()
        self.reaped: dict[str, float] = {}
        self._owned: set[int] = set()
        self._lock = threading.Lock()
        self._poll = poll
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reaper", daemon=True)
        self._thread.start()

    def owned(self, pids: Sequence[int]) -> None:
        """Leave these children to their own waiter (a Popen that will wait for them)."""
        with self._lock:
            self._owned.update(pids)

    def spawn(self, argv: Sequence[str], **kwargs: object) -> subprocess.Popen[str]:
        """Popen whose pid is known to the reaper before it can exit (its Popen waits for it)."""
        with self._lock:
            proc: subprocess.Popen[str] = subprocess.Popen(argv, text=True, **kwargs)  # type: ignore[call-overload]
            self._owned.add(proc.pid)
        return proc

    def release(self, pid: int) -> None:
        """Its Popen has waited for it: the pid is the reaper's again (the kernel may reuse it)."""
        with self._lock:
            self._owned.discard(pid)

    def run(self, argv: Sequence[str], timeout: float = 60.0, **kwargs: object) -> tuple[int, str, str]:
        """Run a short command to its end: (exit code, stdout, stderr)."""
        proc = self.spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        finally:
            self.release(proc.pid)
        return proc.returncode, out, err

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._reap_one():
                time.sleep(self._poll)

    def _reap_one(self) -> bool:
        with self._lock:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return False
            if info is None or info.si_pid in self._owned:
                return False
            pid = info.si_pid
            stat = _stat(pid)
            try:
                _, _, usage = os.wait4(pid, 0)
            except ChildProcessError:
                return True
            name = stat[0] if stat else "?"
            self.reaped[name] = self.reaped.get(name, 0.0) + usage.ru_utime + usage.ru_stime
            return True

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def snapshot(roots: dict[int, str], reaper: Reaper | None = None) -> dict[str, float]:
    """CPU seconds used so far under each name (see the module's docstring); "(client)" is this
    process's own CPU and its waited-for children's outside the reaper (e.g. sbatch's)."""
    me = os.getpid()
    table: dict[int, tuple[str, int, float, float]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                table[int(entry)] = stat
    used: dict[str, float] = {}
    tops: dict[int, int | None] = {}

    def top(pid: int) -> int | None:
        """The root, or the benchmark's direct child, that `pid` is below (None: neither)."""
        chain: list[int] = []
        found: int | None = None
        while True:
            if pid in tops:
                found = tops[pid]
                break
            parent = table[pid][1]
            if pid in roots or parent == me:
                found = pid
                break
            if parent not in table:
                break
            chain.append(pid)
            pid = parent
        for p in [*chain, pid]:
            tops.setdefault(p, found)
        return found

    def add(name: str, cpu: float) -> None:
        used[name] = used.get(name, 0.0) + cpu

    for pid, (_, _, own, waited) in table.items():
        t = top(pid) if pid != me else None
        if t is None:
            continue
        if t not in roots:
            add(table[t][0], own + waited)
        elif t == pid:
            add(roots[t], own)
            add(roots[t] + " children", waited)
        else:
            add(roots[t] + " children", own + waited)
    if reaper is not None:
        for name, cpu in reaper.reaped.items():
            add(name, cpu)
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = sum(reaper.reaped.values()) if reaper else 0.0
    used["(client)"] = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime - reaped
    return used


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds used between two snapshots, by name (names that used none left out)."""
    out = {k: round(after.get(k, 0.0) - before.get(k, 0.0), 4) for k in after.keys() | before.keys()}
    return {k: v for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v > 0}
