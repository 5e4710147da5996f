"""Each process's memory as the event log and the backlog grow: RSS at 1M events, at 100,000 pending.

Every deciding service holds a fold of the log (`corral.projection.ClusterView`), rebuilt from the
whole log at start; how much of the log that fold keeps is what this measures. For each point
(`--points`), a fresh stack:

1. the log is written straight into a fresh Postgres with COPY (`bench/readmodel.py`'s
   `LogBuilder`: nodes and queues, jobs that ran to the end, ~14 events each as the live system
   writes them, one running gang per node, then `pending` admitted jobs waiting for GPUs), and the
   outbox relay's position is set to the log's head, as if every event had been published: the
   services' state is a fold of the log, so a log written this way is the same state a service
   rebuilds after a restart on a cluster that wrote it over months (a million events through the
   services would take hours on this machine);
2. `corral up`'s stack (`corral.stack.up.Stack`: admission, quota, placement + standby,
   preemption, the simulated node agents, the gateway, nats-server) starts on that database; each
   service folds the whole log before it consumes (`/readyz` says when);
3. RSS is sampled from /proc every `--interval` s per process: VmRSS for each Python process and
   nats-server (peak: the larger of the samples' and the kernel's VmHWM), and for Postgres the sum
   of PSS over the postmaster and its backends (their RSS would count shared buffers once per
   backend). Peak covers the rebuild; steady is the median over the last `--settle` seconds, once
   every service is ready;
4. `--submit N` jobs are then submitted through the inbox (the live path: admission, quota,
   placement), in batches, and sampled again: what the live path adds on top of the rebuilt fold.

    .venv/bin/python bench/memory.py [--points log:1000000:1000,backlog:350000:100000] [--json F]
    .venv/bin/python bench/memory.py --smoke     # 3,000 events, 50 waiting, 2 nodes (the test suite's)

The machine is shared: memory figures do not depend on its load as times do, but the load is said
(bench/machine_probe.py's line) because a loaded machine stretches the rebuild the peak covers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from live import machine_line
from readmodel import LogBuilder, _copy

from corral.client import Client
from corral.contracts.jobspec import validate_job_spec
from corral.eventstore import EventStore
from corral.stack.servers import PostgresServer, http_ok
from corral.stack.up import Stack, StackOptions

DECIDERS = ("admission", "quota", "placement", "preemption")
POINTS = "log:1000000:1000,backlog:350000:100000"


@dataclass(frozen=True)
class Point:
    label: str
    events: int
    pending: int


def parse_points(text: str) -> list[Point]:
    points = []
    for part in text.split(","):
        label, events, pending = part.split(":")
        points.append(Point(label, int(events), int(pending)))
    return points


def _status_kib(pid: int, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _pss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _children() -> dict[int, list[int]]:
    table: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        table.setdefault(parent, []).append(int(entry))
    return table


def tree_pss_kib(pid: int) -> int:
    """PSS of `pid` and every process below it (a Postgres server's backends): shared buffers
    counted once, split between the processes that map them."""
    children, total, todo = _children(), 0, [pid]
    while todo:
        current = todo.pop()
        total += _pss_kib(current) or 0
        todo.extend(children.get(current, ()))
    return total


@dataclass
class Sampler:
    """RSS of each named process every `interval` s, in a thread; pids are asked for at each sample
    (a restarted service is the same name)."""

    stack: Stack
    postgres: PostgresServer
    interval: float = 0.5
    samples: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    hwm: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def pids(self) -> dict[str, int]:
        named = {p.name: p.pid for p in self.stack.processes if p.pid is not None and p.alive()}
        if self.stack.nats is not None and self.stack.nats.proc is not None:
            named["nats-server"] = self.stack.nats.proc.pid
        return {k: v for k, v in named.items() if v is not None}

    def sample(self) -> None:
        now = time.monotonic()
        for name, pid in self.pids().items():
            rss = _status_kib(pid, "VmRSS")
            if rss is not None:
                self.samples.setdefault(name, []).append((now, rss))
            hwm = _status_kib(pid, "VmHWM")
            if hwm is not None:
                self.hwm[name] = max(self.hwm.get(name, 0), hwm)
        if self.postgres.proc is not None:
            self.samples.setdefault("postgres (PSS)", []).append((now, tree_pss_kib(self.postgres.proc.pid)))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def figures(self, since: float, until: float) -> dict[str, dict[str, float]]:
        """MiB per process: peak over the whole run, median over [since, until]."""
        out = {}
        for name, series in sorted(self.samples.items()):
            window = [kib for t, kib in series if since <= t <= until] or [series[-1][1]]
            peak = max(max(kib for _, kib in series), self.hwm.get(name, 0))
            out[name] = {"peak_mib": peak / 1024, "steady_mib": statistics.median(window) / 1024}
        return out


async def build_log(dsn: str, point: Point, nodes: int) -> float:
    """The point's log in the database, written with COPY; the relay's position at its head."""
    started = time.perf_counter()
    records = LogBuilder(point.events, nodes).build(point.pending)
    store = await EventStore.open(dsn)
    try:
        async with store.connection() as conn:
            await _copy(conn, records)
            await conn.execute("INSERT INTO relay_positions (relay, position) VALUES ('relay', $1)", records[-1][2])
    finally:
        await store.close()
    return time.perf_counter() - started


def not_ready(stack: Stack) -> list[str]:
    """The deciding services whose `/readyz` does not answer 200 yet (still folding the log).
    Placement is ready when its leader is, whichever of its two processes holds the lease."""
    ready = {p.name.removesuffix("-standby") for p in stack.processes
             if p.metrics_url and http_ok(f"{p.metrics_url}/readyz", 2.0)}
    return [name for name in DECIDERS if name not in ready]


async def submit_batches(stack: Stack, count: int, batch: int = 50) -> float:
    """`count` one-GPU jobs through the inbox (Client.submit), `batch` at a time; seconds taken."""
    assert stack.context is not None
    started = time.perf_counter()
    spec = validate_job_spec({"name": "mem", "queue": "batch", "gpus_per_replica": 1, "runtime": "sim",
                              "duration_seconds": 600})
    async with await Client.connect(stack.context, timeout=30.0) as client:
        for i in range(0, count, batch):
            await asyncio.gather(*(client.submit(spec) for _ in range(min(batch, count - i))))
    return time.perf_counter() - started


def run_point(point: Point, args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="corral-bench-memory-"))
    root.chmod(0o755)  # the embedded Postgres runs as its own user under root
    server = PostgresServer(root / "pg").start()
    stack: Stack | None = None
    result: dict[str, Any] = {"label": point.label, "events": point.events, "pending": point.pending,
                              "nodes": args.nodes}
    try:
        result["fill_s"] = asyncio.run(build_log(server.dsn, point, args.nodes))
        print(f"[{point.label}] {point.events:,} events ({point.pending:,} pending) written in "
              f"{result['fill_s']:.0f} s", flush=True)
        stack = Stack(StackOptions(data_dir=root / "stack", cluster=f"{args.nodes}x8:H100", postgres_dsn=server.dsn,
                                   runtime="sim-timer", namespace="bench", placement_standby=True,
                                   extra_env={"CORRAL_LOG_LEVEL": "WARNING"}))
        began = time.monotonic()
        stack.start()
        sampler = Sampler(stack, server, interval=args.interval)
        sampler.start()
        try:
            while waiting := not_ready(stack):
                if time.monotonic() - began > args.timeout:
                    raise TimeoutError(f"not ready after {args.timeout:.0f} s: {', '.join(waiting)}")
                stack.supervise()
                time.sleep(1.0)
            result["ready_s"] = time.monotonic() - began
            print(f"[{point.label}] every service folded the log and is ready after {result['ready_s']:.0f} s",
                  flush=True)
            settle_from = time.monotonic()
            time.sleep(args.settle)
            result["rebuilt"] = sampler.figures(settle_from, time.monotonic())
            if args.submit:
                result["submit_s"] = asyncio.run(submit_batches(stack, args.submit))
                after = time.monotonic()
                time.sleep(min(args.settle, 10.0))
                result["after_submit"] = sampler.figures(after, time.monotonic())
            print(render([result], args.submit), flush=True)  # kept if a later point is stopped
        finally:
            sampler.stop()
    finally:
        if stack is not None:
            stack.stop()
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    return result


def render(results: Sequence[dict[str, Any]], submit: int) -> str:
    names = sorted({n for r in results for n in r.get("rebuilt", {})})
    lines = []
    for r in results:
        lines.append(f"{r['label']}: {r['events']:,} events in the log, {r['pending']:,} jobs pending, "
                     f"{r['nodes']} nodes (ready {r.get('ready_s', float('nan')):.0f} s after start)")
        head = f"  {'process':<20} {'peak MiB':>9} {'steady MiB':>11}"
        if "after_submit" in r:
            head += f" {f'+{submit} submitted':>17}"
        lines.append(head)
        for name in names:
            fig = r["rebuilt"].get(name)
            if fig is None:
                continue
            line = f"  {name:<20} {fig['peak_mib']:>9.1f} {fig['steady_mib']:>11.1f}"
            if "after_submit" in r and name in r["after_submit"]:
                line += f" {r['after_submit'][name]['steady_mib']:>17.1f}"
            lines.append(line)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", default=POINTS, help="label:events:pending, comma separated")
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--settle", type=float, default=60.0, help="seconds sampled once every service is ready")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("--submit", type=int, default=500, help="jobs submitted through the inbox afterwards")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for the services' rebuild")
    parser.add_argument("--json", type=Path, help="write the figures as JSON here")
    parser.add_argument("--smoke", action="store_true", help="3,000 events, 50 waiting, 2 nodes; 20 submitted")
    args = parser.parse_args(argv)
    # A stop (SIGTERM, a CI runner's timeout) goes through the `finally`s as Ctrl-C does: the stack
    # and the Postgres server are stopped and their folder removed.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if args.smoke:
        args.points, args.nodes, args.settle, args.submit, args.interval = "smoke:3000:50", 2, 2.0, 20, 0.2
    machine = machine_line()
    print(machine, flush=True)
    results = [run_point(p, args) for p in parse_points(args.points)]
    print()
    print(machine)
    print(render(results, args.submit))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"machine": machine, "load1": os.getloadavg()[0], "points": results,
                                         "argv": sys.argv[1:]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
