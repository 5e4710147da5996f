"""The live system as the benchmarks drive it: start the stack, pace submissions, read timings back.

Why a module of its own: `bench/e2e.py` and `bench/kueue_baseline.py` measure the same thing — the
real services as separate processes on real nats-server and Postgres — under different workloads.
Starting the stack, submitting at a rate and turning the event log into per-job timings is the
same for both, and it must be done the same way for their figures to be comparable.

Timings come from the event log only, never from the benchmark's own clock (except to pace):
- submitted: the time in the JobSubmitted's event id (a ULID), stamped by the client when it
  publishes to the inbox (its `occurred_at` is when admission received it);
- admitted / placed / running: `recorded_at` of `QuotaReserved`, `GangReserved`, `JobRunning`,
  i.e. when the decision was durable in the log (Postgres `now()` of the appending statement, a
  little after the service's own `occurred_at`). Same host, same clock.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shutil
import signal
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from machine_probe import probe

from corral.client import Client
from corral.cluster_ready import wait_for_nodes
from corral.contracts import events as ev
from corral.contracts.envelope import event_id_time
from corral.contracts.jobspec import JobSpec
from corral.contracts.registry import decode
from corral.eventstore.records import StoredEvent
from corral.stack.context import Context
from corral.stack.up import Stack, StackOptions

TRACKED = ("JobSubmitted", "JobAdmitted", "JobRejected", "QuotaReserved", "GangReserved", "JobRunning",
           "JobCompleted", "JobFailed")


def machine() -> dict[str, object]:
    """The machine the figures were measured on: cores and CPU model from /proc/cpuinfo."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            mem = f"{int(f.readline().split()[1]) / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    measured = probe()
    return {"cores": os.cpu_count(), "cpu": model, "memory": mem, "python": platform.python_version(),
            "platform": platform.platform(), "host": platform.node(), "probe": measured.__dict__,
            "probe_line": measured.line()}


def report(result: dict[str, object], json_path: Path | None, render: Callable[[dict[str, object]], str]) -> int:
    """Print a benchmark's table and, when asked, write its figures (with date and machine) as JSON."""
    result.setdefault("date", datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"))
    result.setdefault("machine", machine())
    print()
    print(render(result))
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0


def machine_line() -> str:
    m = machine()
    return (f"{m['cores']} cores, {m['cpu']}, {m['memory']} RAM, Python {m['python']}, {m['platform']}\n"
            f"probe:   {m['probe_line']} (bench/machine_probe.py: compare runs across machines by it)")


@dataclass
class LiveStack:
    """A started stack and where it keeps its data (removed on stop unless kept)."""

    stack: Stack
    context: Context
    data_dir: Path
    keep: bool = False

    def stop(self) -> None:
        self.stack.stop()
        if not self.keep:
            shutil.rmtree(self.data_dir, ignore_errors=True)


def start_stack(cluster: str, *, runtime: str = "sim-timer", data_dir: Path | None = None,
                env: dict[str, str] | None = None, standby: bool = True, timeout: float = 120.0) -> LiveStack:
    """`corral up` in a fresh directory: embedded servers, the services, the simulated nodes.

    `runtime` is the node agents': `sim-timer` (default) simulates each gang as a timer inside the
    agent; `sim` starts one `corral.worker sim` process per rank (tens of ms of CPU per start).
    """
    keep = data_dir is not None
    # A stop (SIGTERM: `timeout`, a CI runner) goes through the callers' `finally: live.stop()` as
    # Ctrl-C does; by default it ended the process at once and left the stack running.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    root = data_dir or Path(tempfile.mkdtemp(prefix="corral-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    probe(root)  # before the stack starts: the machine as the run found it
    stack = Stack(StackOptions(data_dir=root, cluster=cluster, runtime=runtime, namespace="bench",
                               placement_standby=standby, write_user_context=False,
                               extra_env={"CORRAL_LOG_LEVEL": "WARNING", **(env or {})}))
    try:
        ctx = stack.start()
        wait_for_nodes(ctx, stack, timeout)
    except BaseException:
        stack.stop()
        raise
    return LiveStack(stack, ctx, root, keep)


#: The stack runtimes a live benchmark takes: `process` runs each rank as a real process (the
#: agents' stepd, then `/bin/sleep` for the job's run time), the others simulate it.
RUNTIMES = ("sim-timer", "sim", "process")


def job_run(runtime: str, seconds: float, workdir: Path) -> dict[str, object]:
    """The spec fields that make a job run `seconds` under the stack's `runtime`: a simulated run
    (`sim`, which `sim-timer` runs as a timer), or, for `process`, `/bin/sleep` as a real process."""
    if runtime == "process":
        return {"runtime": "process", "command": ["/bin/sleep", f"{seconds:g}"], "workdir": str(workdir)}
    return {"runtime": "sim", "duration_seconds": seconds}


def _proc_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds used so far by it and the children it waited for) for every
    process on the machine."""
    tick = os.sysconf("SC_CLK_TCK")
    table: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # its own CPU and its waited-for children's (the agents' stepds and jobs, which end)
        table[int(entry)] = (int(fields[1]), sum(int(x) for x in fields[11:15]) / tick)
    return table


def tree_cpu(pid: int) -> float:
    """CPU seconds used so far by process `pid` and every process below it (a Postgres server's
    backends)."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += table.get(current, (0, 0.0))[1]
        todo.extend(children.get(current, ()))
    return total


def stack_roots(live: LiveStack) -> dict[int, str]:
    """pid -> name of each process the stack started: the services, the agents and the servers."""
    roots: dict[int, str] = {p.pid: p.name for p in live.stack.processes if p.pid is not None}
    for name, server in (("nats-server", live.stack.nats), ("postgres", live.stack.postgres)):
        proc = getattr(server, "proc", None) if server is not None else None
        if proc is not None:
            roots[proc.pid] = name
    return roots


def stack_cpu(live: LiveStack) -> dict[str, float]:
    """CPU seconds used so far by each part of the stack, its child processes included (Postgres
    backends, workers): what a run costs, whatever else shares the machine."""
    roots = stack_roots(live)
    table = _proc_table()
    owner: dict[int, str] = {}

    def find(pid: int) -> str | None:
        seen = []
        while pid > 1 and pid not in owner and pid not in roots:
            seen.append(pid)
            pid = table.get(pid, (0, 0.0))[0]
        name = owner.get(pid) or roots.get(pid)
        if name is not None:
            owner.update(dict.fromkeys(seen, name))
        return name

    used: dict[str, float] = {}
    for pid, (_, cpu) in table.items():
        part = find(pid)
        if part is not None:
            used[part] = used.get(part, 0.0) + cpu
    return used


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: round(after.get(k, 0.0) - before.get(k, 0.0), 3) for k in sorted(after)}


async def log_position(client: Client) -> int:
    """The last global position in the log: a run's events are the ones after it."""
    after = 0
    while True:
        batch = await client.store.read_all(after, limit=10000)
        if not batch:
            return after
        after = batch[-1].position


async def submit_paced(client: Client, jobs: Sequence[tuple[str, JobSpec]], rate: float,
                       max_in_flight: int = 256) -> float:
    """Publish `jobs` to the inbox at `rate` per second (open loop); return the seconds it took.

    Open loop: the schedule does not slow down when the system does, so queueing shows up as
    latency. Publishes overlap (each waits for JetStream's ack) up to `max_in_flight`.
    """
    gate = asyncio.Semaphore(max_in_flight)
    tasks: list[asyncio.Task[str]] = []

    async def one(job_id: str, spec: JobSpec) -> str:
        try:
            return await client.submit(spec, job_id=job_id, user="bench")
        finally:
            gate.release()

    start = time.monotonic()
    for i, (job_id, spec) in enumerate(jobs):
        due = start + i / rate
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await gate.acquire()
        tasks.append(asyncio.create_task(one(job_id, spec)))
    await asyncio.gather(*tasks)
    return time.monotonic() - start


PLACED = ("GangReserved", "JobRejected")
ENDED = ("JobCompleted", "JobFailed", "JobCancelled", "JobRejected")


async def wait_placed(client: Client, job_ids: Iterable[str], after: int, timeout: float,
                      progress: bool = True, until: Sequence[str] = PLACED) -> tuple[int, bool]:
    """Tail the log (types and streams only, no decoding) until every job has one of `until`
    (default: placed or rejected). Returns (the position reached, whether all got there in time).
    """
    want = {f"job-{j}" for j in job_ids}
    what = "placed" if tuple(until) == PLACED else "done"
    done: set[str] = set()
    deadline = time.monotonic() + timeout
    last_print = time.monotonic()
    position = after
    while True:
        batch = await client.store.read_all(position, limit=10000)
        for stored in batch:
            if stored.type in until and stored.stream in want:
                done.add(stored.stream)
        if batch:
            position = batch[-1].position
            continue
        if len(done) >= len(want):
            return position, True
        now = time.monotonic()
        if now > deadline:
            return position, False
        if progress and now - last_print > 5:
            print(f"    ... {len(done)}/{len(want)} {what}", flush=True)
            last_print = now
        await asyncio.sleep(0.25)


@dataclass
class JobTimes:
    job_id: str
    gpus: int = 0
    queue: str = ""
    name: str = ""
    submitted: datetime | None = None
    admitted: datetime | None = None
    quota: datetime | None = None
    placed: datetime | None = None
    running: datetime | None = None
    ended: datetime | None = None
    rejected: bool = False
    gpus_by_node: dict[str, int] = field(default_factory=dict)


async def collect(client: Client, job_ids: Iterable[str], after: int) -> dict[str, JobTimes]:
    """Per-job timings from the log after `after` (first occurrence of each event)."""
    wanted = {f"job-{j}": j for j in job_ids}
    times = {j: JobTimes(j) for j in wanted.values()}
    async for stored in _log_after(client, after):
        job_id = wanted.get(stored.stream)
        if job_id is None or stored.type not in TRACKED:
            continue
        t = times[job_id]
        if stored.type == "JobSubmitted":
            event = decode(stored.data)
            assert isinstance(event, ev.JobSubmitted)
            t.submitted, t.gpus, t.queue = event_id_time(event.event_id), event.spec.total_gpus, event.spec.queue
            t.name = event.spec.name
        elif stored.type == "JobAdmitted" and t.admitted is None:
            t.admitted = stored.recorded_at
        elif stored.type == "JobRejected":
            t.rejected = True
        elif stored.type == "QuotaReserved" and t.quota is None:
            t.quota = stored.recorded_at
        elif stored.type == "GangReserved" and t.placed is None:
            t.placed = stored.recorded_at
        elif stored.type == "JobRunning" and t.running is None:
            t.running = stored.recorded_at
        elif stored.type in ("JobCompleted", "JobFailed") and t.ended is None:
            t.ended = stored.recorded_at
    return times


async def _log_after(client: Client, after: int) -> AsyncIterator[StoredEvent]:
    """Every stored event after position `after`, read a page at a time."""
    position = after
    while True:
        batch = await client.store.read_all(position, limit=10000)
        if not batch:
            return
        position = batch[-1].position
        for stored in batch:
            yield stored


def bus_messages(live: LiveStack) -> tuple[int, int]:
    """(messages in, messages out) nats-server counted since it started (its `/varz`): publishes,
    acks and pull requests in; deliveries, replies and publish acks out."""
    import urllib.request

    port = json.loads((live.data_dir / "ports.json").read_text())["nats-monitor"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/varz", timeout=5) as answer:
        varz = json.loads(answer.read())
    return int(varz["in_msgs"]), int(varz["out_msgs"])


#: `events_by_type`'s keys for PlacementPending by writer and reason code start with this.
PENDING_BY = "PlacementPending by "


async def events_by_type(client: Client, after: int) -> dict[str, int]:
    """How many events of each type the log holds after position `after`; PlacementPending also by
    writer and reason code (keys `PENDING_BY` + "<writer> <code>": a backlog's reasons)."""
    counts: dict[str, int] = {}
    async for stored in _log_after(client, after):
        counts[stored.type] = counts.get(stored.type, 0) + 1
        if stored.type == "PlacementPending":
            event = decode(stored.data)
            assert isinstance(event, ev.PlacementPending)
            key = f"{PENDING_BY}{event.actor} {event.reason.code}"
            counts[key] = counts.get(key, 0) + 1
    return counts


def deliveries(counts: dict[str, int]) -> int:
    """Messages those events make the bus deliver to the services (each type's `flow` consumers;
    the node agents' copies not included)."""
    from corral.contracts.flow import NODE_AGENT, flow_of
    from corral.contracts.registry import REGISTRY

    consumers = {cls.__name__: [c for c in flow_of(cls).consumers if c != NODE_AGENT] for cls in REGISTRY.classes()}
    return sum(n * len(consumers.get(t, ())) for t, n in counts.items() if not t.startswith(PENDING_BY))


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def latency_ms(times: Iterable[JobTimes], end: str) -> dict[str, float]:
    """p50 / p99 / mean / max of submit -> `end` in milliseconds, over jobs that reached it."""
    values = [(getattr(t, end) - t.submitted).total_seconds() * 1e3 for t in times
              if t.submitted is not None and getattr(t, end) is not None]
    if not values:
        return {"n": 0}
    return {"n": len(values), "p50": percentile(values, 50), "p99": percentile(values, 99),
            "mean": statistics.fmean(values), "max": max(values)}


def steady_rate(moments: Sequence[datetime], trim: float = 0.1) -> dict[str, float]:
    """Events per second in steady state: the middle (1 - 2*trim) of the events over their span.

    Also the best and the median whole second, to show whether the rate was flat.
    """
    if len(moments) < 10:
        return {"n": len(moments)}
    ordered = sorted(m.timestamp() for m in moments)
    lo, hi = int(len(ordered) * trim), int(len(ordered) * (1 - trim)) - 1
    span = ordered[hi] - ordered[lo]
    buckets: dict[int, int] = {}
    for m in ordered:
        buckets[int(m)] = buckets.get(int(m), 0) + 1
    full = [buckets.get(s, 0) for s in range(int(ordered[0]) + 1, int(ordered[-1]))]  # whole seconds only
    return {"n": len(ordered), "steady_per_s": (hi - lo) / span if span > 0 else float("inf"),
            "overall_per_s": (len(ordered) - 1) / max(ordered[-1] - ordered[0], 1e-9),
            "best_second": max(full) if full else len(ordered),
            "median_second": statistics.median(full) if full else len(ordered)}
