"""How the control plane and the bus grow with the number of hosts: N nodes x 8 GPUs, each node
its own NATS connection, identity and durable consumer.

The stack is `corral up` with no simulated agents of its own (`Agents.NONE`) and one identity per
node (`agent_nodes`, as for `corral agent` hosts); the nodes are lightweight simulated agents
(`SimAgent`), many per process (`--agents-per-process`), each connecting with its node's
credentials, consuming `<ns>.events.node.<node>.>` with its node's durable (the create call its
identity allows), registering, heartbeating, and reporting its ranks started and, after the
job's run time, exited. They run no processes: what is measured is the scheduler and the bus.

Each size: submit `--rate` jobs/s of mixed sizes (1 to 32 GPUs, up to 4 nodes) for `--seconds`
(less on a cluster too small to hold that rate: `size_rate`), each running long enough to keep
about `--load` of the GPUs busy (at most a minute), then wait for the jobs to be placed and to end,
and print:
- deliveries per job to agents (total, per node the job touched, and per agent), counted by the
  agents, beside the acceptance bound 3 x nodes touched + a constant;
- nats-server's CPU and RSS, each service's CPU per job and RSS, and apart the simulated agents'
  processes and the driver's own (not the control plane, but on the same cores);
- placement's decision time p50/p99 (its reconcile histogram, `corral_scheduling_cycle_duration_seconds`),
  submit->placed p50/p99 (from the log);
- the durable consumers' backlog (services' and agents', from nats-server's /jsz) every
  `--sample-every` seconds of the submissions, and whether it grows over them;
- then, on a standing load of 2 hour-long jobs per node, `corral nodes`, `nodes --rack`,
  `top --once` and `jobs` as fresh processes (wall and their own CPU, p50 of 3);
- the machine probe after each size (the load changes while a run lasts),
and all sizes side by side with the acceptance rows. `--smoke`: 10 and 20 nodes, a few seconds
each (tests/bench).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import msgspec
from cli import wait_quiet
from live import LiveStack, collect, latency_ms, log_position, machine_line, stack_cpu, stack_roots, wait_placed
from machine_probe import Probe, fdatasync_ms, python_ms, steal_pct

from corral.bus import Bus, Delivery
from corral.client import Client
from corral.contracts.cluster import GpuDevice
from corral.contracts.envelope import job_stream, node_stream
from corral.contracts.events import NodeHeartbeat, NodeRegistered, WorkerExited, WorkerStarted
from corral.contracts.flow import names
from corral.contracts.jobspec import JobSpec
from corral.contracts.node_work import JOB_WORK, decode_assignment
from corral.contracts.node_work import KIND as ASSIGNMENT
from corral.contracts.queues import validate_queues
from corral.contracts.registry import encode
from corral.contracts.subjects import Subjects
from corral.services.node_agent.reporting.reports import exit_reason
from corral.services.node_agent.service import durable_name
from corral.stack.up import Agents, Stack, StackOptions

NAMESPACE = "bench"
GPUS_PER_NODE = 8
NODES_PER_RACK = 16
#: (GPUs, weight): mixed sizes, the larger ones gangs over 2 and 4 nodes
STOPS = names(JOB_WORK)  # a running job stops here on any of them (a preemption too: no checkpoint)
SIZES = ((1, 40), (2, 20), (4, 15), (8, 15), (16, 7), (32, 3))


def node_names(count: int) -> list[str]:
    return [f"n{i:04d}" for i in range(count)]


# --- the simulated agents (run in child processes: `--agents-worker FILE`) ----------------------

class SimAgent:
    """One node: its own connection and durable; reports ranks started, and exited after the
    job's run time (or stopped by a release or cancel)."""

    def __init__(self, node: str, rack: str, bus: Bus) -> None:
        self.node, self.rack, self.bus = node, rack, bus
        self.subjects = Subjects(NAMESPACE)
        self.actor = f"node-agent/{node}"
        self.deliveries: Counter[str] = Counter()
        self.running: dict[str, tuple[int, list[int], asyncio.TimerHandle]] = {}
        self.beats = 0

    def registration(self) -> NodeRegistered:
        return NodeRegistered.new(stream=node_stream(self.node), actor=self.actor, correlation_id=self.node,
                                  node=self.node, gpus=[GpuDevice(index=i, model="H100") for i in range(GPUS_PER_NODE)],
                                  nvlink_domains=[list(range(GPUS_PER_NODE))], rack=self.rack, zone="zone-0")

    async def start(self) -> None:
        await self.bus.consume(durable_name([self.node]), [self.subjects.node_work_wildcard(self.node)],
                               self.on_delivery, deliver_new_only=True, batch=32, inactive_threshold=3600.0)
        await self.report(self.registration())

    async def report(self, event: Any) -> None:
        await self.bus.publish(self.subjects.node_report(self.node, event.type), encode(event), event.event_id,
                               timeout=30.0)

    async def heartbeat(self) -> None:
        self.beats += 1
        beat = NodeHeartbeat.new(stream=node_stream(self.node), actor=self.actor, correlation_id=self.node,
                                 node=self.node, sequence=self.beats, running_job_ids=sorted(self.running))
        await self.bus.nc.publish(self.subjects.heartbeat(self.node), encode(beat))

    async def on_delivery(self, delivery: Delivery) -> None:
        kind = delivery.subject.rpartition(".")[2]
        self.deliveries[kind] += 1
        if kind == ASSIGNMENT:
            assignment = decode_assignment(delivery.data)
            gang, submitted = assignment.reservation, assignment.submission
            ranks = [r.rank for r in gang.ranks if r.node == self.node]
            if not ranks or gang.job_id in self.running:
                return
            seconds = (submitted.spec.duration_seconds or 1.0) if submitted is not None else 0.0
            loop = asyncio.get_running_loop()
            timer = loop.call_later(seconds, lambda: asyncio.ensure_future(self.exit(gang.job_id, "COMPLETED", 0)))
            self.running[gang.job_id] = (gang.attempt, ranks, timer)
            for rank in ranks:
                await self.report(WorkerStarted.new(stream=job_stream(gang.job_id), actor=self.actor,
                                                    correlation_id=gang.job_id, job_id=gang.job_id, rank=rank,
                                                    node=self.node, pid=100000 + rank, attempt=gang.attempt))
        elif kind in STOPS:
            job = delivery.headers.get("Corral-Stream", "")[4:]
            if job in self.running:
                await self.exit(job, "STOPPED", -15)
        elif kind == "NodeLost":
            await self.report(self.registration())

    async def exit(self, job: str, code: str, exit_code: int) -> None:
        held = self.running.pop(job, None)
        if held is None:
            return
        attempt, ranks, timer = held
        timer.cancel()
        for rank in ranks:
            await self.report(WorkerExited.new(
                stream=job_stream(job), actor=self.actor, correlation_id=job, job_id=job, rank=rank, node=self.node,
                exit_code=exit_code if exit_code >= 0 else None, attempt=attempt,
                reason=exit_reason(code, exit_code, rank)))


async def agents_worker(config_path: Path) -> None:
    """A process hosting some nodes' SimAgents until SIGTERM; SIGUSR1 writes their counts so far
    (the driver asks at the end of the measured run, before the reads' standing load)."""
    config = json.loads(config_path.read_text())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, lambda: Path(config["out"]).write_text(
        json.dumps({a.node: dict(a.deliveries) for a in agents})))
    gate = asyncio.Semaphore(16)
    agents: list[SimAgent] = []

    async def one(node: str, rack: str, creds: str) -> None:
        async with gate:
            # a loaded server may drop a TLS handshake or answer a create or a publish late: try
            # again, as an agent would (the durable and the registration's event id make it safe)
            for attempt in range(1, 11):
                bus = None
                try:
                    bus = await Bus.connect(config["nats_url"], NAMESPACE, name=f"sim-agent-{node}",
                                            credentials=creds, ca=config.get("ca"))
                    agent = SimAgent(node, rack, bus)
                    await agent.start()
                    agents.append(agent)
                    return
                except Exception:
                    if bus is not None:
                        with contextlib.suppress(Exception):
                            await bus.close()
                    if attempt == 10:
                        raise
                    await asyncio.sleep(min(attempt, 5))

    async def beats() -> None:  # from the first registration on: placement counts a node lost after 10 s
        while True:
            for agent in list(agents):
                with contextlib.suppress(Exception):
                    await agent.heartbeat()
            await asyncio.sleep(2.0)

    task = asyncio.create_task(beats())
    await asyncio.gather(*(one(n["node"], n["rack"], n["credentials"]) for n in config["nodes"]))
    Path(config["ready"]).write_text(str(len(agents)))
    await stop.wait()
    task.cancel()
    await asyncio.gather(*(a.bus.close() for a in agents), return_exceptions=True)


# --- the driver ------------------------------------------------------------------------------

def rss_mib(pid: int) -> float:
    """Resident memory of `pid` and every process below it, MiB."""
    total, todo = 0, [pid]
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry))
    while todo:
        current = todo.pop()
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        todo.extend(children.get(current, ()))
    return total / 1024


def cycle_histogram(url: str | None) -> dict[float, float]:
    """Placement's reconcile-time histogram (cumulative count per upper bound) from its /metrics."""
    if not url:
        return {}
    try:
        text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    buckets: dict[float, float] = {}
    pattern = re.compile(r'^corral_scheduling_cycle_duration_seconds_bucket\{.*le="([^"]+)".*\} (\S+)$')
    for line in text.splitlines():
        m = pattern.match(line)
        if m:
            bound = float("inf") if m.group(1) == "+Inf" else float(m.group(1))
            buckets[bound] = buckets.get(bound, 0.0) + float(m.group(2))
    return buckets


def histogram_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The upper bound of the bucket holding quantile `q` of what was observed between two scrapes."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    want = q * counts[-1]
    return next((b for b, c in zip(bounds, counts, strict=True) if c >= want), None)


def backlog(monitor_port: int | None) -> dict[str, int]:
    """Messages the durable consumers have not yet been delivered or not acknowledged, from
    nats-server's /jsz: the services' together and the agents' together."""
    if not monitor_port:
        return {}
    try:
        url = f"http://127.0.0.1:{monitor_port}/jsz?consumers=true"
        data = json.loads(urllib.request.urlopen(url, timeout=10).read())
    except (OSError, ValueError):
        return {}
    total = {"services": 0, "agents": 0}
    for account in data.get("account_details", []):
        for stream in account.get("stream_detail", []):
            for consumer in stream.get("consumer_detail", []) or []:
                name = consumer.get("name", "")
                who = "agents" if name.startswith("node-agent") else "services"
                total[who] += int(consumer.get("num_pending", 0)) + int(consumer.get("num_ack_pending", 0))
    return total


#: The reads timed at each size (`corral <args>`), as a person runs them: a summary by default, a
#: rack's nodes by filter, one frame of top, the first page of jobs.
READS = {"nodes": ("nodes",), "nodes --rack": ("nodes", "--rack", "rack-0"), "top --once": ("top", "--once"),
         "jobs": ("jobs",)}
#: What `corral nodes` and `corral top` answer within on 1,000 nodes (the issue's target).
READ_TARGET_MS = 500.0


def command_ms(data_dir: Path, args: Sequence[str], runs: int = 3) -> dict[str, float] | None:
    """Wall and CPU time (ms, p50 of `runs` after one uncounted warm-up run) of `corral <args>`
    against the stack, as a fresh process whose output goes to a pipe (None: it failed). CPU: the
    process's own (its rusage), what a loaded machine changes least. Its modules' bytecode is
    cached, as for an installed CLI (a shell exporting PYTHONDONTWRITEBYTECODE would compile every
    module on every call)."""
    corral = Path(sys.executable).parent / "corral"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(COLUMNS="120", CORRAL_LOG_LEVEL="WARNING")
    walls, cpus = [], []
    for i in range(runs + 1):
        start = time.monotonic()
        proc = subprocess.Popen([str(corral), "--context", str(data_dir), *args], env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert proc.stdout is not None
        proc.stdout.read()
        proc.stdout.close()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = (time.monotonic() - start) * 1e3
        if os.waitstatus_to_exitcode(status) != 0:
            return None
        if i > 0:
            walls.append(wall)
            cpus.append((usage.ru_utime + usage.ru_stime) * 1e3)
    return {"wall": round(sorted(walls)[len(walls) // 2], 1), "cpu": round(sorted(cpus)[len(cpus) // 2], 1)}


def process_cpu(pids: Sequence[int]) -> float:
    """CPU seconds used so far by the processes `pids` (user + system)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def trend(samples: Sequence[int]) -> dict[str, Any]:
    """Whether a backlog sampled at even intervals grows over the run: its mean over the last
    third against the first third's (growing: more than twice it and 100 messages more)."""
    if len(samples) < 3:
        return {"samples": list(samples), "growing": None}
    third = max(1, len(samples) // 3)
    first, last = sum(samples[:third]) / third, sum(samples[-third:]) / third
    return {"samples": list(samples), "first_third": round(first, 1), "last_third": round(last, 1),
            "growing": last > 2 * first + 100}


def mean_gpus(nodes: int) -> float:
    sizes = [(s, w) for s, w in SIZES if s <= nodes * GPUS_PER_NODE]
    return sum(s * w for s, w in sizes) / sum(w for _, w in sizes)


#: Seconds a job holds its GPUs at the least: its shortest run time and the way through placement,
#: start, exit and release.
HOLD_SECONDS = 1.0


def size_rate(rate: float, nodes: int, load: float) -> float:
    """The submission rate at a size: `rate`, or less when the cluster cannot take it (jobs held
    `HOLD_SECONDS` keeping `load` of its GPUs busy). 100 jobs/s of 4.7 GPUs on 10 nodes would
    measure a queue growing for the whole run, not the size."""
    return min(rate, round(load * nodes * GPUS_PER_NODE / (mean_gpus(nodes) * HOLD_SECONDS), 1))


def workload(count: int, nodes: int, rate: float, load: float, seed: int) -> list[tuple[str, JobSpec]]:
    rng = random.Random(seed)
    sizes = [s for s, _ in SIZES if s <= nodes * GPUS_PER_NODE]
    weights = [w for s, w in SIZES if s <= nodes * GPUS_PER_NODE]
    mean = mean_gpus(nodes)
    # run time keeping about `load` of the GPUs busy at `rate` (at most a minute: a low rate on a
    # large cluster would otherwise make the run wait minutes for its jobs to end)
    seconds = min(60.0, max(0.5, load * nodes * GPUS_PER_NODE / (rate * mean)))
    jobs = []
    for i in range(count):
        gpus = rng.choices(sizes, weights)[0]
        replicas, per = (gpus // GPUS_PER_NODE, GPUS_PER_NODE) if gpus > GPUS_PER_NODE else (1, gpus)
        jobs.append((f"s{seed}-{i:06d}", JobSpec(name=f"scale-{i}", queue="bench", runtime="sim", replicas=replicas,
                                                 gpus_per_replica=per, duration_seconds=round(seconds, 2))))
    return jobs


Worker = tuple[subprocess.Popen[bytes], Path, Path]  # the process, its ready file, its counts file


def start_agents(live: LiveStack, nodes: list[str], per_process: int, work: Path) -> list[Worker]:
    keys = live.data_dir / "credentials"
    ctx = live.context
    workers = []
    for k in range(0, len(nodes), per_process):
        chunk = nodes[k:k + per_process]
        config = {"nats_url": ctx.nats_url, "ca": getattr(ctx, "nats_ca", None),
                  "nodes": [{"node": n, "rack": f"rack-{i // NODES_PER_RACK}",
                             "credentials": str(keys / f"agent-{durable_name([n])}.json")}
                            for i, n in enumerate(chunk, start=k)],
                  "ready": str(work / f"ready-{k}"), "out": str(work / f"counts-{k}.json")}
        path = work / f"agents-{k}.json"
        path.write_text(json.dumps(config))
        proc = subprocess.Popen([sys.executable, __file__, "--agents-worker", str(path)],
                                env={**os.environ, "CORRAL_LOG_LEVEL": "WARNING"})
        workers.append((proc, Path(config["ready"]), Path(config["out"])))
    return workers


def delivery_counts(workers: Sequence[Worker], timeout: float = 60.0) -> dict[str, dict[str, int]]:
    """node -> kind -> deliveries so far, from every agents' process (SIGUSR1: each writes its file)."""
    for _, _, out in workers:
        out.unlink(missing_ok=True)
    for proc, _, _ in workers:
        proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    counts: dict[str, dict[str, int]] = {}
    for _, _, out in workers:
        while True:
            with contextlib.suppress(OSError, ValueError):
                counts.update(json.loads(out.read_text()))
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
    return counts


async def submit_paced(client: Client, jobs: Sequence[tuple[str, JobSpec]], rate: float) -> None:
    """Submit `jobs` at `rate` a second (at most 256 waiting for their acknowledgement)."""
    gate = asyncio.Semaphore(256)

    async def one(job_id: str, spec: JobSpec) -> None:
        try:
            await client.submit(spec, job_id=job_id, user="bench")
        finally:
            gate.release()

    tasks = []
    t0 = time.monotonic()
    for i, (job_id, spec) in enumerate(jobs):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await gate.acquire()
        tasks.append(asyncio.create_task(one(job_id, spec)))
    await asyncio.gather(*tasks)


async def sample_backlog(monitor: int | None, every: float, into: list[dict[str, int]]) -> None:
    """Append the consumers' backlog (`backlog`) every `every` seconds until cancelled."""
    while True:
        into.append(await asyncio.to_thread(backlog, monitor))
        await asyncio.sleep(every)


async def standing_load(client: Client, live: LiveStack, nodes: int, rate: float, seed: int) -> int:
    """Fill the cluster for the reads: 2 jobs per node of an hour each (most of them run, the rest
    wait), then wait for the stack to settle. Returns the number of jobs."""
    jobs = [(f"r{job_id[1:]}", msgspec.structs.replace(spec, duration_seconds=3600.0))
            for job_id, spec in workload(2 * nodes, nodes, rate, 0.5, seed)]
    await submit_paced(client, jobs, rate)
    await asyncio.to_thread(wait_quiet, live, 0.5, 120.0)
    return len(jobs)


async def measure(args: argparse.Namespace, nodes: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="corral-scale-"))
    names = node_names(nodes)
    started = time.monotonic()
    stack = Stack(StackOptions(data_dir=root, namespace=NAMESPACE, runtime="sim-timer", agents=Agents.NONE,
                               agent_nodes=tuple(names), placement_standby=False, gateway=False,
                               extra_env={"CORRAL_LOG_LEVEL": "WARNING"}))
    ctx = stack.start()
    live = LiveStack(stack, ctx, root, args.keep)
    if args.keep:
        print(f"  data and logs: {root}", flush=True)
    workers: list[Worker] = []
    try:
        workers = start_agents(live, names, args.agents_per_process, root)
        agent_pids = [proc.pid for proc, _, _ in workers]
        client = await Client.connect(ctx)
        try:
            await client.apply_queues(validate_queues({"queues": [{"name": "bench", "guaranteed_gpus": 0}]}))
            await client.wait_for(lambda v: "bench" in v.queues and len(v.nodes) >= nodes, args.start_timeout)
            start_seconds = time.monotonic() - started
            print(f"  {nodes} nodes up in {start_seconds:.0f} s", flush=True)
            rate = size_rate(args.rate, nodes, args.load)
            jobs = workload(int(rate * args.seconds), nodes, rate, args.load, args.seed)
            after = await log_position(client)
            placement = next((p for p in stack.processes if p.name == "placement"), None)
            monitor = getattr(stack.nats, "monitor_port", None)
            hist_before = cycle_histogram(placement.metrics_url if placement else None)
            cpu_before = stack_cpu(live)
            agents_before, driver_before = process_cpu(agent_pids), own_cpu()
            wall = time.monotonic()
            samples: list[dict[str, int]] = []
            sampler = asyncio.create_task(sample_backlog(monitor, args.sample_every, samples))
            await submit_paced(client, jobs, rate)
            submitted = len(samples)
            _, all_placed = await wait_placed(client, [j for j, _ in jobs], after, args.timeout, progress=False)
            await asyncio.sleep(max(1.0, max(s.duration_seconds or 0 for _, s in jobs) + 1.0))
            sampler.cancel()
            cpu = stack_cpu(live)
            agents_cpu, driver_cpu = process_cpu(agent_pids) - agents_before, own_cpu() - driver_before
            wall = time.monotonic() - wall
            hist_after = cycle_histogram(placement.metrics_url if placement else None)
            deliveries = await asyncio.to_thread(delivery_counts, workers)
            behind = await asyncio.to_thread(backlog, monitor)
            times = await collect(client, [j for j, _ in jobs], after)
            standing = await standing_load(client, live, nodes, args.rate, args.seed + 1) if args.reads else 0
        finally:
            await client.close()
        reads = {name: command_ms(root, argv) for name, argv in READS.items()} if args.reads else {}
        probe_line = Probe(python_ms(), *fdatasync_ms(root), steal_pct(), os.getloadavg()[0]).line()
        roots = stack_roots(live)
        rss = {name: round(rss_mib(pid), 1) for pid, name in roots.items()}
        rss["agents"] = round(sum(rss_mib(pid) for pid in agent_pids), 1)
        for proc, _, _ in workers:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
        placed_nodes = [len(t.gpus_by_node) or -(-t.gpus // GPUS_PER_NODE) for t in times.values() if t.placed]
        total = sum(sum(c.values()) for c in deliveries.values())
        kinds: Counter[str] = Counter()
        for c in deliveries.values():
            kinds.update(c)
        per_agent = sorted(sum(c.values()) for c in deliveries.values())
        njobs = len(jobs)
        touched = sum(placed_nodes) / max(1, len(placed_nodes))
        used = {k: round(cpu.get(k, 0.0) - cpu_before.get(k, 0.0), 2) for k in sorted(cpu)}
        used[f"agents ({len(workers)} processes)"] = round(agents_cpu, 2)
        used["bench driver"] = round(driver_cpu, 2)
        return {
            "nodes": nodes, "gpus": nodes * GPUS_PER_NODE, "jobs": njobs, "rate": rate, "seconds": args.seconds,
            "start_seconds": round(start_seconds, 1), "all_placed": all_placed, "wall_seconds": round(wall, 1),
            "deliveries": total, "deliveries_per_job": round(total / max(1, njobs), 2),
            "nodes_touched_per_job": round(touched, 2),
            "deliveries_per_node_touched": round(total / max(1, njobs) / max(touched, 1e-9), 2),
            "deliveries_by_kind": dict(kinds),
            "per_agent": {"mean": round(total / max(1, len(per_agent)), 1), "max": per_agent[-1] if per_agent else 0,
                          "agents_with_none": sum(1 for d in per_agent if d == 0)},
            "cpu_seconds": used, "cpu_ms_per_job": {k: round(v / max(1, njobs) * 1e3, 2) for k, v in used.items()},
            "rss_mib": rss,
            "placement_decision_ms": {q: (None if (v := histogram_quantile(hist_before, hist_after, q / 100)) is None
                                          else round(v * 1e3, 1)) for q in (50, 99)},
            "submit_to_placed_ms": latency_ms(times.values(), "placed"),
            "backlog": {who: trend([b.get(who, 0) for b in samples[:max(submitted, 1)]])
                        for who in ("services", "agents")} | {"every_seconds": args.sample_every},
            "backlog_after_run": behind,
            "standing_jobs_for_reads": standing,
            "command_ms": reads,
            "probe_after": probe_line,
        }
    finally:
        for proc, _, _ in workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        live.stop()


def render(results: list[dict[str, Any]]) -> str:
    def row(label: str, values: Sequence[object]) -> str:
        return f"{label:<38}" + "".join(f"{v!s:>18}" for v in values)

    def fmt(v: float | None, unit: str = "") -> str:
        return "-" if v is None else f"{v:,.1f}{unit}"

    def share(r: dict[str, Any], name: str) -> str:
        return fmt(100 * r["cpu_seconds"].get(name, 0) / max(r["wall_seconds"], 1e-9), "%")

    lines = [row("nodes x 8 GPUs", [r["nodes"] for r in results])]
    lines.append(row("jobs (rate/s x s)", [f"{r['jobs']} ({r['rate']:g}x{r['seconds']:g})" for r in results]))
    lines.append(row("start (stack + agents), s", [r["start_seconds"] for r in results]))
    lines.append(row("run (submissions to the last end), s", [r["wall_seconds"] for r in results]))
    lines.append(row("deliveries per job", [r["deliveries_per_job"] for r in results]))
    lines.append(row("nodes touched per job", [r["nodes_touched_per_job"] for r in results]))
    lines.append(row("deliveries per node touched", [r["deliveries_per_node_touched"] for r in results]))
    lines.append(row("per agent over the run mean/max", [f"{r['per_agent']['mean']}/{r['per_agent']['max']}"
                                                          for r in results]))
    lines.append(row("nats-server CPU ms/job", [fmt(r["cpu_ms_per_job"].get("nats-server")) for r in results]))
    lines.append(row("nats-server CPU, share of a core", [share(r, "nats-server") for r in results]))
    lines.append(row("nats-server RSS MiB", [fmt(r["rss_mib"].get("nats-server")) for r in results]))
    names = sorted({k for r in results for k in r["cpu_ms_per_job"] if k != "nats-server"},
                   key=lambda k: (k.startswith(("agents", "bench")), k))
    for name in names:
        label = "agents" if name.startswith("agents") else name
        lines.append(row(f"{name[:24]} CPU ms/job", [fmt(r["cpu_ms_per_job"].get(name)) for r in results]))
        lines.append(row(f"{name[:24]} CPU, share of a core", [share(r, name) for r in results]))
        if label in results[0]["rss_mib"]:
            lines.append(row(f"{label} RSS MiB", [fmt(r["rss_mib"].get(label)) for r in results]))
    lines.append(row("placement decision p50/p99 ms (<=)", [
        f"{fmt(r['placement_decision_ms'][50])}/{fmt(r['placement_decision_ms'][99])}" for r in results]))
    lines.append(row("submit->placed p50/p99 ms", [
        f"{fmt(r['submit_to_placed_ms'].get('p50'))}/{fmt(r['submit_to_placed_ms'].get('p99'))}" for r in results]))
    for who in ("services", "agents"):
        thirds = [(r["backlog"][who].get("first_third", "-"), r["backlog"][who].get("last_third", "-"))
                  for r in results]
        lines.append(row(f"{who}' backlog first/last third", [f"{a}/{b}" for a, b in thirds]))
        lines.append(row(f"{who}' backlog growing", [r["backlog"][who]["growing"] for r in results]))
    lines.append(row("backlog after the run: services/agents", [
        f"{r['backlog_after_run'].get('services', '-')}/{r['backlog_after_run'].get('agents', '-')}" for r in results]))
    for name in READS:
        lines.append(row(f"corral {name} ms, wall/CPU", [
            "-" if (c := r["command_ms"].get(name)) is None else f"{fmt(c['wall'])}/{fmt(c['cpu'])}" for r in results]))
    lines.append(row("every job placed", [r["all_placed"] for r in results]))
    lines.append(row("deliveries <= 3 x touched + 2", [
        r["deliveries_per_job"] <= 3 * r["nodes_touched_per_job"] + 2 for r in results]))
    lines.append(row("placed p99 < 500 ms", [(r["submit_to_placed_ms"].get("p99") or 1e9) < 500 for r in results]))
    lines.append(row("nats-server under one core", [
        r["cpu_seconds"].get("nats-server", 0) < r["wall_seconds"] for r in results]))
    lines.append(row("reads (nodes, top) CPU < 500 ms", [
        all((c := r["command_ms"].get(n)) is not None and c["cpu"] < READ_TARGET_MS for n in ("nodes", "top --once"))
        if r["command_ms"] else "-" for r in results]))
    lines.append("")
    lines.append("backlog samples (services' consumers, every "
                 f"{results[0]['backlog']['every_seconds']:g} s of the submissions):")
    for r in results:
        lines.append(f"  {r['nodes']:>5} nodes: {' '.join(str(x) for x in r['backlog']['services']['samples'])}")
    lines.append("probe after each size:")
    for r in results:
        lines.append(f"  {r['nodes']:>5} nodes: {r['probe_after']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=lambda s: [int(x) for x in s.split(",")], default=[10, 100, 1000],
                   help="cluster sizes, comma-separated (default 10,100,1000)")
    p.add_argument("--rate", type=float, default=100.0, help="submissions per second (default 100)")
    p.add_argument("--seconds", type=float, default=60.0, help="seconds of submissions per size (default 60)")
    p.add_argument("--load", type=float, default=0.5, help="share of GPUs the jobs' run times keep busy")
    p.add_argument("--agents-per-process", type=int, default=250, help="simulated agents per process")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for every job to be placed")
    p.add_argument("--start-timeout", type=float, default=600.0, help="seconds for the nodes to register")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep", action="store_true", help="keep each size's data folder (the services' logs)")
    p.add_argument("--sample-every", type=float, default=5.0, help="seconds between backlog samples")
    p.add_argument("--no-reads", dest="reads", action="store_false",
                   help="skip timing corral nodes/top/jobs (and the standing load they are timed on)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--smoke", action="store_true", help="10 and 20 nodes, a few seconds each (the test suite)")
    p.add_argument("--agents-worker", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.agents_worker is not None:
        asyncio.run(agents_worker(args.agents_worker))
        return 0
    if args.smoke:
        args.nodes, args.rate, args.seconds, args.timeout, args.sample_every = [10, 20], 5.0, 3.0, 120.0, 1.0
    print(machine_line(), flush=True)
    results = []
    for nodes in args.nodes:
        rate = size_rate(args.rate, nodes, args.load)
        print(f"{nodes} nodes x {GPUS_PER_NODE} GPUs: {rate:g} jobs/s for {args.seconds:g} s", flush=True)
        results.append(asyncio.run(measure(args, nodes)))
    print()
    print(render(results))
    if args.json:
        args.json.write_text(json.dumps({"results": results, "machine": machine_line()}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
