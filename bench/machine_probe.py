"""How fast this machine is today, measured: the figure that makes two runs comparable.

Why: the same code on two 2-core VMs with the same CPU name can measure 50% apart on the
Kueue-shaped benchmark (bench/README.md), and a machine line that does not tell the two apart
makes the gap read as the code's. The
live benchmarks are paced by the event log's commits (each waits for an fsync) and by the
interpreter's speed, so the probe times both, once, before the stack starts:
- python_ms: a fixed pure-Python workload (dicts, attribute reads, small ints), best of 5;
- fdatasync_ms: p50 / p90 of 100 fdatasync calls of 8 KiB in the directory the data goes to;
- steal_pct and load1: CPU time the hypervisor gave to others over 0.5 s, and the load average.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Probe:
    python_ms: float
    fdatasync_p50_ms: float
    fdatasync_p90_ms: float
    steal_pct: float | None
    load1: float

    def line(self) -> str:
        steal = "?" if self.steal_pct is None else f"{self.steal_pct:.0f}%"
        return (f"python {self.python_ms:.0f} ms, fdatasync p50 {self.fdatasync_p50_ms:.2f} / p90 "
                f"{self.fdatasync_p90_ms:.2f} ms, steal {steal}, load {self.load1:.1f}")


class _Item:
    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = value


def python_ms(rounds: int = 5) -> float:
    """Milliseconds for a fixed mix of what the services do most (dict writes and reads, attribute
    reads, small-int arithmetic, a sort), best of `rounds`."""
    best = float("inf")
    for _ in range(rounds):
        began = time.perf_counter()
        table: dict[str, _Item] = {}
        for i in range(60_000):
            table[f"job-{i % 5000}"] = _Item(i)
        total = 0
        for _ in range(4):
            for item in table.values():
                total += item.value & 7
        sorted(table, key=lambda k: table[k].value)
        best = min(best, time.perf_counter() - began)
    return best * 1e3


def fdatasync_ms(directory: Path, count: int = 100) -> tuple[float, float]:
    """p50 and p90 of `count` fdatasync calls after an 8 KiB write, in `directory`."""
    fd, name = tempfile.mkstemp(prefix="probe-", dir=directory)
    try:
        times = []
        block = b"\0" * 8192
        for _ in range(count):
            os.write(fd, block)
            began = time.perf_counter()
            os.fdatasync(fd)
            times.append(time.perf_counter() - began)
    finally:
        os.close(fd)
        os.unlink(name)
    times.sort()
    return times[len(times) // 2] * 1e3, times[int(len(times) * 0.9)] * 1e3


def steal_pct(seconds: float = 0.5) -> float | None:
    """Share of CPU time stolen by the hypervisor over `seconds` (None without /proc/stat)."""
    def sample() -> list[int]:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    try:
        before = sample()
        time.sleep(seconds)
        after = sample()
    except (OSError, ValueError):
        return None
    delta = [b - a for a, b in zip(before, after, strict=False)]
    total = sum(delta[:8])
    return 100.0 * delta[7] / total if total and len(delta) > 7 else None


_probed: Probe | None = None


def probe(directory: Path | None = None) -> Probe:
    """The machine measured once per process (the first call's directory is the one timed)."""
    global _probed
    if _probed is None:
        _probed = Probe(python_ms(), *fdatasync_ms(directory or Path(tempfile.gettempdir())), steal_pct(),
                        os.getloadavg()[0])
    return _probed


def probe_line(directory: Path | None = None) -> str:
    """The line every benchmark prints before its figures: compare runs across machines by it."""
    return f"probe:   {probe(directory).line()} (bench/machine_probe.py: compare runs across machines by it)"


if __name__ == "__main__":
    print(probe_line())
