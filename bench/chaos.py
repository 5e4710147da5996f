"""Chaos run: the live system under a stream of jobs while its parts are killed, stopped and cut off.

Why: "nothing lost, nothing leaked, no GPU used twice" must hold while processes die, not only on a
quiet machine. This run starts the whole of `corral up` (16 simulated nodes x 8 GPUs, runtime
`sim`: every rank a real process) on its own nats-server and Postgres, has 4 submitters publish
jobs (1-8 GPU jobs, 2-node gangs, crashing jobs, preemptible jobs that checkpoint, and an urgent
stream that preempts them), and meanwhile, from a seeded schedule:
  - kill -9 a random service (or the node agents) every few seconds (restarted, as `corral up` does);
  - SIGSTOP a service for 5-30 s, then SIGCONT;
  - restart nats-server twice and Postgres once (same port and data; Postgres kept down 60 s);
  - machine faults: `--disk-full` fills (and frees) the NATS store, Postgres' data and a node's
    state folder, each on a tmpfs of its own (root only); `--clock-offset` runs the last node's
    agent in a process of its own under libfaketime (`clock_faults.py`), its clock (and its
    stepds' and ranks') minutes ahead of the control plane's, then as far behind, then ahead
    again (each step a kill -9 and a restart with the new offset).
A sampler reads /proc/*/environ of the workers every 0.25 s (CORRAL_JOB_ID, CUDA_VISIBLE_DEVICES
and the node, from CORRAL_NODE or the CORRAL_CONTROL path) and records any GPU on which two jobs'
processes live at once. At the end the faults stop, the run waits for quiescence (no job
between states, no node lost) and checks: `corral audit verify` passes; zero accepted jobs lost
(every acknowledged submission is in the log and terminal, running, or waiting with a reason);
zero stuck (nothing starting/running/preempting without processes); zero GPUs with two jobs'
processes; zero nodes still lost. It prints the seed, the faults injected and the counts, and
exits 1 when any of them is not zero.

Run: .venv/bin/python bench/chaos.py [--minutes 20] [--seed N] [--jobs-per-submitter 250] [--json FILE]
                                     [--disk-full] [--clock-offset [SECONDS]]
     .venv/bin/python bench/chaos.py --smoke   (about 2 minutes; what tests/chaos runs)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.client import Client
from corral.contracts.jobspec import JobSpec, validate_job_spec
from corral.contracts.queues import validate_queues
from corral.projection import ClusterView, JobState
from corral.stack.context import Context
from corral.stack.server_watch import ServerWatch
from corral.stack.servers import NatsServer, PostgresServer, ServerStartError
from corral.stack.up import ManagedProcess, Stack, StackOptions
from corral.telemetry.endpoint import METRICS_ADDR_ENV

# beside this script (also when it is loaded by path, as tests/chaos/test_sampler.py does)
sys.path.insert(0, str(Path(__file__).resolve().parent))
import clock_faults
import disk_faults
from machine_probe import probe_line

STUCK_GRACE_SECONDS = 15.0  # a job holding GPUs without processes for this long is stuck

SERVICE_TARGETS = ("admission", "quota", "placement", "placement-standby", "preemption", "node-agents")
#: The process of the node agent whose clock is off (`--clock-offset`).
SKEWED = "node-agent-skewed"


@dataclass(frozen=True)
class Plan:
    """Every knob of one run; `smoke()` is the short form run by the test suite."""

    seed: int
    fault_seconds: float = 20 * 60.0
    nodes: int = 16
    gpus: int = 8
    submitters: int = 4
    jobs_per_submitter: int = 250
    duration: tuple[float, float] = (5.0, 60.0)
    kill_every: tuple[float, float] = (3.0, 8.0)
    stop_for: tuple[float, float] = (5.0, 30.0)
    stops: int = 6
    nats_restarts: int = 2
    nats_down: float = 5.0
    postgres_restarts: int = 1
    postgres_at: float = 0.45  # when the Postgres outage begins, as a fraction of fault_seconds
    postgres_down: float = 60.0
    quiesce_timeout: float = 600.0
    audit_grace: float = 60.0
    #: Machine faults (`--disk-full`, root only): the NATS store, Postgres' data and node-0's state
    #: folder each on a tmpfs of its own, each filled once for `disk_full_seconds`, then freed.
    disk_faults: bool = False
    disk_full_seconds: float = 30.0
    #: Machine fault (`--clock-offset`): the last node's agent runs on its own with its clock this
    #: many seconds off (0: no such agent), ahead from the start, behind from 40%, ahead from 75%.
    clock_offset: float = 0.0

    @classmethod
    def smoke(cls, seed: int) -> Plan:
        # Postgres stays down 45 s: longer than a consumer's retries of a failing message (~43 s).
        # The outage starts at 8.6 s and ends with the 54 s of load and kills, instead of running on
        # alone past them (which made the run ~20 s longer and proved nothing more).
        return cls(seed=seed, fault_seconds=54.0, submitters=4, jobs_per_submitter=16, duration=(2.0, 7.0),
                   kill_every=(6.0, 10.0), stop_for=(5.0, 8.0), stops=1, nats_down=2.0, postgres_at=0.16,
                   postgres_down=45.0, quiesce_timeout=90.0, audit_grace=30.0)


@dataclass
class Fault:
    at: float
    kind: str  # kill9 | sigstop | nats_restart | postgres_restart | disk_full (target: nats, postgres, agent)
    #          | clock_offset (target: the skewed agent; `seconds` is the new offset)
    target: str
    seconds: float = 0.0


def fault_schedule(plan: Plan, rng: random.Random) -> list[Fault]:
    """The faults of the run, in time order, drawn from the seed alone."""
    faults: list[Fault] = []
    t = rng.uniform(*plan.kill_every)
    while t < plan.fault_seconds:
        faults.append(Fault(t, "kill9", rng.choice(SERVICE_TARGETS)))
        t += rng.uniform(*plan.kill_every)
    kills = list(faults)
    for i, target in enumerate(("node-agents", "placement")):  # every run kills these at least once
        if kills and not any(f.target == target for f in kills):
            kills[(len(kills) // 3) * (i + 1) % len(kills)].target = target
    for i in range(plan.stops):
        faults.append(Fault(plan.fault_seconds * (i + 0.5) / max(plan.stops, 1) + rng.uniform(-1, 1), "sigstop",
                            rng.choice(SERVICE_TARGETS), rng.uniform(*plan.stop_for)))
    for i in range(plan.nats_restarts):
        faults.append(Fault(plan.fault_seconds * (i + 1) / (plan.nats_restarts + 1) + 1.5, "nats_restart", "nats",
                            plan.nats_down))
    for _ in range(plan.postgres_restarts):
        faults.append(Fault(plan.fault_seconds * plan.postgres_at, "postgres_restart", "postgres", plan.postgres_down))
    if plan.disk_faults:  # apart from each other and from the Postgres outage
        for at, target in ((0.2, "nats"), (0.7, "postgres"), (0.85, "agent")):
            faults.append(Fault(plan.fault_seconds * at, "disk_full", target, plan.disk_full_seconds))
    if plan.clock_offset:  # it starts ahead (`Chaos.start`): a step behind, then ahead again
        for at, sign in ((0.4, -1), (0.75, +1)):
            faults.append(Fault(plan.fault_seconds * at, "clock_offset", SKEWED, sign * plan.clock_offset))
    return sorted(faults, key=lambda f: f.at)


def job_spec(plan: Plan, rng: random.Random, n: int, submitter: int) -> JobSpec:
    """One job of a submitter's stream: single 1-8 GPU, a 2-node gang, crashing, or preemptible."""
    kind = rng.choices(("single", "gang", "crash", "preemptible"), weights=(45, 20, 15, 20))[0]
    duration = round(rng.uniform(*plan.duration), 1)
    spec: dict[str, Any] = {"name": f"s{submitter}-{n}-{kind}", "queue": f"team-{'ab'[submitter % 2]}",
                            "runtime": "sim", "duration_seconds": duration,
                            "submission_id": f"chaos-{plan.seed}-{submitter}-{n}"}
    if kind == "single":
        spec["gpus_per_replica"] = rng.choice((1, 2, 4, 8))
    elif kind == "gang":
        spec.update(replicas=2, gpus_per_replica=plan.gpus)
    elif kind == "crash":
        replicas = rng.choice((1, 2))  # a crashing 2-node gang frees whole nodes: what others wait for
        spec.update(replicas=replicas, gpus_per_replica=plan.gpus if replicas == 2 else rng.choice((2, 4)),
                    restart={"max_restarts": rng.choice((0, 1))},
                    env={"CORRAL_SIM_ARGS": "--fail-at-step 8 --fail-rank 0 --checkpoint-every 4"})
    else:
        # Long and low: they keep the cluster full, so freed GPUs are taken at once and urgent jobs preempt.
        spec.update(gpus_per_replica=rng.choice((4, 8)), priority="low", preemptible=True,
                    duration_seconds=duration * 3, checkpoint={"signal": "SIGUSR1", "grace_seconds": 5},
                    env={"CORRAL_SIM_ARGS": "--checkpoint-every 5"})
    return validate_job_spec(spec)


def urgent_spec(plan: Plan, n: int) -> JobSpec:
    return validate_job_spec({"name": f"urgent-{n}", "queue": "team-a", "priority": "urgent", "preemptible": False,
                              "gpus_per_replica": plan.gpus, "runtime": "sim", "duration_seconds": plan.duration[0],
                              "submission_id": f"chaos-{plan.seed}-urgent-{n}"})


# --- the sampler: which job's processes live on which GPU ---------------------------------


@dataclass
class Worker:
    pid: int
    job_id: str
    node: str
    gpus: tuple[int, ...]


def live_workers(nodes_dir: Path) -> list[Worker]:
    """Worker processes of this run (their CORRAL_CONTROL is under `nodes_dir`), zombies excluded."""
    out = []
    prefix = str(nodes_dir) + os.sep
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
            with open(f"/proc/{name}/environ", "rb") as f:
                raw = f.read()
        except (OSError, IndexError):
            continue
        if b"CORRAL_JOB_ID=" not in raw:
            continue
        env = dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)
        control = env.get("CORRAL_CONTROL", "")
        if not control.startswith(prefix):
            continue
        node = env.get("CORRAL_NODE") or control[len(prefix):].split(os.sep, 1)[0]
        gpus = tuple(int(g) for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip().isdigit())
        out.append(Worker(int(name), env["CORRAL_JOB_ID"], node, gpus))
    return out


@dataclass
class Sampler:
    nodes_dir: Path
    interval: float = 0.25
    samples: int = 0
    incidents: dict[tuple[str, int, tuple[str, ...]], dict[str, Any]] = field(default_factory=dict)
    pids: set[int] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            holders: dict[tuple[str, int], set[str]] = {}
            for w in live_workers(self.nodes_dir):
                self.pids.add(w.pid)
                for g in w.gpus:
                    holders.setdefault((w.node, g), set()).add(w.job_id)
            self.samples += 1
            now = round(time.monotonic() - started, 2)
            for (node, gpu), jobs in holders.items():
                if len(jobs) > 1:
                    key = (node, gpu, tuple(sorted(jobs)))
                    seen = self.incidents.setdefault(key, {"node": node, "gpu": gpu, "jobs": sorted(jobs),
                                                           "first_seen_s": now, "samples": 0})
                    seen["samples"] += 1
                    seen["last_seen_s"] = now
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()


# --- the run -------------------------------------------------------------------------------


class Chaos:
    def __init__(self, plan: Plan, root: Path) -> None:
        self.plan, self.root = plan, root
        self.rng = random.Random(plan.seed)
        self.nats = NatsServer(root / "nats")
        self.postgres = PostgresServer(root / "postgres")
        self.stack: Stack | None = None
        self.accepted: dict[str, str] = {}  # job id -> kind
        self.publish_retries = 0
        self.injected: Counter[str] = Counter()
        self.log: list[dict[str, Any]] = []
        self.stopped: set[str] = set()
        self.restarts: Counter[str] = Counter()
        self.t0 = time.monotonic()
        self.servers_down: set[str] = set()
        self._supervising = True
        self.mounts: list[Path] = []
        self.clock_offsets: list[dict[str, Any]] = []  # each offset the skewed node ran with, from when
        self.watches = [ServerWatch("nats", self.nats, say=lambda m: self.note(m)),
                        ServerWatch("postgres", self.postgres, say=lambda m: self.note(m))]

    def note(self, what: str, **details: Any) -> None:
        entry = {"t": round(time.monotonic() - self.t0, 1), "what": what, **details}
        self.log.append(entry)
        print(f"[chaos {entry['t']:7.1f}s] {what} {details if details else ''}", flush=True)

    # ---- set-up ------------------------------------------------------------------------------
    def folder(self, target: str) -> Path:
        """The folder a disk_full fault fills (each its own tmpfs)."""
        return {"nats": self.root / "nats" / "jetstream", "postgres": self.root / "postgres" / "pgdata",
                "agent": self.root / "stack" / "nodes" / "node-0" / "run"}[target]

    def start(self) -> Context:
        if self.plan.disk_faults:
            from corral.stack.servers import _run_as

            self.mounts = [disk_faults.mount(self.folder("nats"), "512m"),
                           disk_faults.mount(self.folder("postgres"), "1g", owner=_run_as(), mode="0700"),
                           disk_faults.mount(self.folder("agent"), "16m")]
        self.nats.start()
        self.postgres.start()
        skewed = 1 if self.plan.clock_offset else 0  # the last node runs apart, its clock off
        self.stack = Stack(StackOptions(
            data_dir=self.root / "stack", cluster=f"{self.plan.nodes - skewed}x{self.plan.gpus}:H100",
            nats_url=self.nats.url, postgres_dsn=self.postgres.dsn, namespace="chaos", runtime="sim",
            write_user_context=False, extra_env={"CORRAL_NODE_LOST_SECONDS": "10", "CORRAL_LOG_LEVEL": "INFO"}))
        ctx = self.stack.start()
        if skewed:
            self.stack.processes.append(self._skewed_agent(self.plan.clock_offset))
            self.stack.process(SKEWED).start()
        threading.Thread(target=self._supervise, daemon=True).start()
        return ctx

    def _skewed_agent(self, offset: float) -> ManagedProcess:
        """node-<nodes-1>'s agent, apart from the others, with its clock `offset` seconds off."""
        assert self.stack is not None
        agents = self.stack.process("node-agents")
        cluster = self.root / "skewed-cluster"
        cluster.write_text(f"{self.plan.nodes}x{self.plan.gpus}:H100\n")
        node = f"node-{self.plan.nodes - 1}"
        argv = [sys.executable, "-m", "corral.services.node_agent", "--inventory", str(cluster), "--node", node,
                "--runtime", "sim", "--state-dir", str(self.root / "stack" / "nodes"), "--advertise-address", "none",
                "--port-range", "auto", "--metrics-address", "off"]
        env = {k: v for k, v in agents.env.items() if k != METRICS_ADDR_ENV}
        self.clock_offsets.append({"t": round(time.monotonic() - self.t0, 1), "node": node, "offset": offset})
        return ManagedProcess(SKEWED, argv, {**env, **clock_faults.env(offset)}, agents.log_path.with_name(
            f"{SKEWED}.log"))

    async def _clock_step(self, offset: float) -> None:
        """The skewed node's clock steps to `offset`: its agent is killed and started with it (its
        stepds, adopted, keep the clock they started with)."""
        assert self.stack is not None
        p = self.stack.process(SKEWED)
        env = {**p.env, **clock_faults.env(offset)}
        self.clock_offsets.append({"t": round(time.monotonic() - self.t0, 1), "node": self.clock_offsets[0]["node"],
                                   "offset": offset})
        self.note("clock offset", target=SKEWED, offset_seconds=offset, pid=p.pid)
        p.env = env
        p.kill(signal.SIGKILL)  # the supervision starts it again, with the new clock

    def _supervise(self) -> None:
        """What `corral up` does today: restart a service that exited (not one we SIGSTOPped)."""
        assert self.stack is not None
        while self._supervising:
            for p in list(self.stack.processes):
                if not p.alive() and p.name not in self.stopped:
                    self.restarts[p.name] += 1
                    with contextlib.suppress(OSError):
                        p.start()
            for watch in self.watches:  # exited, or alive but wedged (a store that met a full disk)
                if watch.name not in self.servers_down and watch.round(time.monotonic()):
                    self.restarts[watch.name] += 1
            time.sleep(0.5)

    # ---- faults ------------------------------------------------------------------------------
    async def inject(self, faults: list[Fault]) -> None:
        assert self.stack is not None
        stops: list[asyncio.Task[None]] = []
        for f in faults:
            await asyncio.sleep(max(0.0, f.at - (time.monotonic() - self.t0)))
            self.injected[f.kind] += 1
            if f.kind == "kill9":
                p = self.stack.process(f.target)
                self.note("kill -9", target=f.target, pid=p.pid)
                p.kill(signal.SIGKILL)
            elif f.kind == "sigstop":
                stops.append(asyncio.create_task(self._sigstop(f.target, f.seconds)))
            elif f.kind == "nats_restart":
                stops.append(asyncio.create_task(self._restart_server(self.nats, "nats", f.seconds)))
            elif f.kind == "postgres_restart":
                stops.append(asyncio.create_task(self._restart_server(self.postgres, "postgres", f.seconds)))
            elif f.kind == "disk_full":
                stops.append(asyncio.create_task(self._disk_full(f.target, f.seconds)))
            elif f.kind == "clock_offset":
                await self._clock_step(f.seconds)
        await asyncio.gather(*stops)

    async def _disk_full(self, target: str, seconds: float) -> None:
        folder = self.folder(target)
        filler = await asyncio.to_thread(disk_faults.fill, folder)
        self.note("disk full", target=target, folder=str(folder), seconds=seconds)
        await asyncio.sleep(seconds)
        filler.unlink()
        self.note("disk freed", target=target)

    async def _sigstop(self, target: str, seconds: float) -> None:
        assert self.stack is not None
        p = self.stack.process(target)
        if not p.alive() or p.proc is None:
            return
        self.stopped.add(target)
        self.note("SIGSTOP", target=target, pid=p.pid, seconds=round(seconds, 1))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.proc.pid, signal.SIGSTOP)
        await asyncio.sleep(seconds)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.proc.pid, signal.SIGCONT)
        self.stopped.discard(target)
        self.note("SIGCONT", target=target)

    async def _restart_server(self, server: NatsServer | PostgresServer, name: str, down: float) -> None:
        self.note(f"{name} stop", down_seconds=down)
        self.servers_down.add(name)
        await asyncio.to_thread(server.stop)
        await asyncio.sleep(down)
        while True:  # as corral up does: a server that cannot start (its disk full) is tried again
            try:
                await asyncio.to_thread(server.start)
                break
            except (ServerStartError, OSError) as exc:
                self.note(f"{name} did not start; trying again in 1 s", error=str(exc).splitlines()[0][:200])
                await asyncio.sleep(1.0)
        for watch in self.watches:  # a planned stop is no death: its watch starts afresh
            if watch.server is server:
                watch.backoff.started(time.monotonic())
                watch.liveness.started(time.monotonic())
        self.servers_down.discard(name)
        self.note(f"{name} started again", port=server.port)

    # ---- load --------------------------------------------------------------------------------
    async def submitter(self, client: Client, index: int) -> None:
        rng = random.Random(f"{self.plan.seed}-{index}")
        gap = self.plan.fault_seconds / self.plan.jobs_per_submitter
        for n in range(self.plan.jobs_per_submitter):
            spec = job_spec(self.plan, rng, n, index)
            await self._submit(client, spec, spec.name.rsplit("-", 1)[1])
            if n + 1 < self.plan.jobs_per_submitter:  # no pause after the last one
                await asyncio.sleep(rng.uniform(0.5, 1.5) * gap)

    async def urgent(self, client: Client) -> None:
        n = 0
        every = max(self.plan.fault_seconds / 8, 5.0)
        await asyncio.sleep(every / 2)
        while time.monotonic() - self.t0 < self.plan.fault_seconds:
            await self._submit(client, urgent_spec(self.plan, n), "urgent")
            n += 1
            await asyncio.sleep(every)

    async def _submit(self, client: Client, spec: JobSpec, kind: str) -> None:
        """Publish until JetStream acknowledges (the same submission id: duplicates are dropped).
        An acknowledged submission is accepted: the system owes it an outcome."""
        job_id = f"c{self.plan.seed % 1000}-{spec.submission_id}".replace("chaos-", "")[:60]
        deadline = time.monotonic() + 300
        while True:
            try:
                await asyncio.wait_for(client.submit(spec, job_id=job_id, user="chaos"), 10)
                self.accepted[job_id] = kind
                return
            except Exception:
                self.publish_retries += 1
                if time.monotonic() > deadline:
                    self.note("submission never acknowledged (not accepted)", job=job_id)
                    return
                await asyncio.sleep(1.0)

    # ---- the end -----------------------------------------------------------------------------
    async def view(self, ctx: Context) -> ClusterView:
        client = await Client.connect(ctx, bus=False)
        try:
            return await client.view()
        finally:
            await client.close()

    async def quiesce(self, ctx: Context) -> ClusterView:
        """Wait until every accepted job is in the log and ended or waiting (the jobs are short: a
        job still running at the timeout is judged by its processes: none means stuck), and no
        node is lost.

        Why the nodes: a run whose last fault was a long SIGSTOP of the node agents had every node
        declared lost by then; nothing ran, so the run was "quiet" 0.2 s after the agents resumed
        (seeds 29 and 30) and never showed that the cluster comes back from losing every node."""
        deadline = time.monotonic() + self.plan.quiesce_timeout
        between = (JobState.SUBMITTED, JobState.STARTING, JobState.RUNNING, JobState.PREEMPTING, JobState.REQUEUING)
        view = ClusterView()
        shown = time.monotonic()
        while True:
            with contextlib.suppress(Exception):
                client = await Client.connect(ctx, bus=False)
                try:
                    view = await client.view()
                finally:
                    await client.close()
                left = Counter(view.jobs[j].state.value if j in view.jobs else "MISSING" for j in self.accepted
                               if j not in view.jobs or view.jobs[j].state in between)
                lost = sum(1 for node in view.nodes.values() if node.lost)
                if not left and not lost:
                    return view
                if time.monotonic() - shown >= 10:
                    shown = time.monotonic()
                    self.note("not quiet yet", left=dict(left), nodes_lost=lost)
            if time.monotonic() > deadline:
                self.note("quiescence not reached", timeout=self.plan.quiesce_timeout)
                return view
            await asyncio.sleep(1.0)

    def audit(self, ctx: Context) -> dict[str, Any]:
        res = subprocess.run(
            [sys.executable, "-m", "corral.cli.main", "--nats", ctx.nats_url, "--postgres", ctx.postgres_dsn,
             "--namespace", ctx.namespace, "audit", "verify", "--json", "--grace", str(self.plan.audit_grace)],
            capture_output=True, text=True, timeout=300)
        try:
            out: dict[str, Any] = json.loads(res.stdout)
        except ValueError:
            out = {"ok": False, "error": res.stderr[-2000:] or res.stdout[-2000:]}
        out["exit_code"] = res.returncode
        out["violations"] = out.get("violations", [])[:50]
        return out

    def stop(self) -> None:
        self._supervising = False
        if self.stack is not None:
            for name in list(self.stopped):  # a SIGSTOPped service must run again to stop cleanly
                with contextlib.suppress(Exception):
                    p = self.stack.process(name)
                    if p.proc is not None:
                        os.killpg(p.proc.pid, signal.SIGCONT)
            self.stack.stop()
        for w in live_workers(self.root / "stack" / "nodes"):  # orphans of killed agents
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.pid, signal.SIGKILL)
        self.nats.stop()
        self.postgres.stop()
        for folder in self.mounts:
            disk_faults.unmount(folder)
        self.mounts = []


async def run(chaos: Chaos) -> dict[str, Any]:
    plan, root = chaos.plan, chaos.root
    faults = fault_schedule(plan, chaos.rng)
    print(f"chaos: seed {plan.seed}, {plan.nodes}x{plan.gpus} GPUs, {plan.submitters} submitters x "
          f"{plan.jobs_per_submitter} jobs, {len(faults)} faults over {plan.fault_seconds:.0f} s; data {root}",
          flush=True)
    sampler = Sampler(root / "stack" / "nodes")
    started = time.monotonic()
    try:
        ctx = chaos.start()
        client = await Client.connect(ctx)
        await client.apply_queues(validate_queues({"queues": [
            {"name": "team-a", "guaranteed_gpus": plan.nodes * plan.gpus // 2, "max_gpus": plan.nodes * plan.gpus},
            {"name": "team-b", "guaranteed_gpus": plan.nodes * plan.gpus // 2, "max_gpus": plan.nodes * plan.gpus}]}))
        await client.wait_for(lambda v: {"team-a", "team-b"} <= set(v.queues) and
                              sum(1 for n in v.nodes.values() if not n.lost) >= plan.nodes, 60)
        threading.Thread(target=sampler.run, daemon=True).start()
        chaos.t0 = time.monotonic()
        phases = {"start": round(chaos.t0 - started, 1)}
        chaos.note("load and faults start")
        await asyncio.gather(chaos.inject(faults), chaos.urgent(client),
                             *(chaos.submitter(client, i) for i in range(plan.submitters)))
        chaos.note("faults over; waiting for quiescence")
        phases["faults"] = round(time.monotonic() - chaos.t0, 1)
        with contextlib.suppress(Exception):
            await client.close()
        view = await chaos.quiesce(ctx)
        phases["quiesce"] = round(time.monotonic() - chaos.t0 - phases["faults"], 1)
        time.sleep(1.0)
        sampler.stop()
        workers = live_workers(root / "stack" / "nodes")
        with_processes = {w.job_id for w in workers}
        states = Counter(view.jobs[j].state.value if j in view.jobs else "MISSING" for j in chaos.accepted)
        lost = sorted(j for j in chaos.accepted if j not in view.jobs or view.jobs[j].state is JobState.SUBMITTED
                      or (view.jobs[j].state is JobState.PENDING and view.jobs[j].reason is None
                          and not view.jobs[j].quota_gpus))
        stuck = sorted(j for j in chaos.accepted if j in view.jobs and view.jobs[j].state.holds_gpus
                       and j not in with_processes)
        if stuck:
            # The view and the process scan are a moment apart: a job whose last rank exited in
            # between is "running without processes" until placement records the exit (the
            # 20-minute run once counted one that completed 1 s later). Stuck is what stays so.
            await asyncio.sleep(STUCK_GRACE_SECONDS)
            again = await chaos.view(ctx)
            alive = {w.job_id for w in live_workers(root / "stack" / "nodes")}
            stuck = [j for j in stuck if j in again.jobs and again.jobs[j].state.holds_gpus
                     and again.jobs[j].attempt == view.jobs[j].attempt and j not in alive]
        leaked = sorted({w.job_id for w in workers if w.job_id in view.jobs and view.jobs[w.job_id].state.terminal})
        # Only the `crash` jobs fail by their own plan: any other FAILED is a success the faults
        # turned into a failure (a full disk's shows as "its stepd died").
        failed = sorted(j for j, kind in chaos.accepted.items() if kind != "crash" and j in view.jobs
                        and view.jobs[j].state is JobState.FAILED)
        audited = time.monotonic()
        audit = chaos.audit(ctx)
        phases["audit"] = round(time.monotonic() - audited, 1)
        result: dict[str, Any] = {
            "seed": plan.seed, "plan": {k: v for k, v in plan.__dict__.items()},
            "seconds": round(time.monotonic() - started, 1), "phase_seconds": phases,
            "faults_injected": dict(chaos.injected), "service_restarts": dict(chaos.restarts),
            "machine_faults": machine_faults(chaos),
            "accepted_jobs": len(chaos.accepted), "publish_retries": chaos.publish_retries,
            "final_states": dict(states),
            "lost": len(lost), "lost_jobs": lost[:30],
            "stuck": len(stuck), "stuck_jobs": stuck[:30],
            "failed_not_by_plan": len(failed), "failed_not_by_plan_jobs": [
                (j, view.jobs[j].reason.message if view.jobs[j].reason else "") for j in failed[:30]],
            "workers_of_ended_jobs": len(leaked), "workers_of_ended_jobs_list": leaked[:30],
            "gpu_double_use": len(sampler.incidents), "gpu_double_use_incidents": list(sampler.incidents.values())[:30],
            # Every node agent runs again once the faults are over: a node still lost by the end of
            # quiescence (which waits for them, `Chaos.quiesce`) did not come back.
            "nodes_lost_at_end": sum(1 for n in view.nodes.values() if n.lost),
            "sampler_samples": sampler.samples, "worker_processes_seen": len(sampler.pids),
            "audit_ok": bool(audit.get("ok")), "audit": audit,
            "fault_log": chaos.log,
        }
        result["ok"] = (result["audit_ok"] and not lost and not stuck and not sampler.incidents
                        and not result["nodes_lost_at_end"] and not failed)
        return result
    finally:
        sampler.stop()
        chaos.stop()


def machine_faults(chaos: Chaos) -> dict[str, Any]:
    """The faults of the machine the run injected: each folder filled (and freed), and the offsets
    the skewed node's clock ran with."""
    disks = [e for e in chaos.log if e["what"] in ("disk full", "disk freed")]
    return {"disk_full": [e["target"] for e in disks if e["what"] == "disk full"],
            "disk_freed": [e["target"] for e in disks if e["what"] == "disk freed"],
            "clock_offsets": chaos.clock_offsets}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=20.0, help="minutes of faults (default 20)")
    p.add_argument("--seed", type=int, default=None, help="seed of the schedule and the jobs (default: random)")
    p.add_argument("--jobs-per-submitter", type=int, default=250)
    p.add_argument("--smoke", action="store_true", help="the short run of the test suite (about 2 minutes)")
    p.add_argument("--json", type=Path, help="write the result here")
    p.add_argument("--keep", action="store_true", help="keep the data directory (logs) afterwards")
    p.add_argument("--disk-full", action="store_true", help="also fill (and free) the NATS store, Postgres' data "
                   "and a node's state folder, each on a tmpfs of its own (root only)")
    p.add_argument("--disk-full-seconds", type=float, default=30.0, help="how long each disk stays full")
    p.add_argument("--clock-offset", type=float, nargs="?", const=300.0, default=0.0, metavar="SECONDS",
                   help="run the last node's agent with its clock this far off (default 300: ahead, then "
                   "behind, then ahead; needs libfaketime)")
    args = p.parse_args(argv)
    print(probe_line(), flush=True)
    if args.disk_full and (why := disk_faults.can_mount()) is not None:
        p.error(f"--disk-full: {why}")
    if args.clock_offset and (why := clock_faults.why_not()) is not None:
        p.error(f"--clock-offset: {why}")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    plan = Plan.smoke(seed) if args.smoke else Plan(seed=seed, fault_seconds=args.minutes * 60,
                                                     jobs_per_submitter=args.jobs_per_submitter)
    plan = dataclasses.replace(plan, disk_faults=args.disk_full, disk_full_seconds=args.disk_full_seconds,
                               clock_offset=abs(args.clock_offset))
    root = Path(tempfile.mkdtemp(prefix="corral-chaos-"))
    # A stop (SIGTERM: `timeout`, a CI runner) interrupts the run as Ctrl-C does: by default it
    # ended the process at once and left the stack it started running. The stack is stopped here,
    # outside the event loop: a KeyboardInterrupt raised inside one of the loop's tasks (a NATS
    # client's connect) ended asyncio.run with the run's task still pending, its own clean-up
    # never ran, and nats-server and Postgres stayed up (the CI's test_chaos_stop caught it).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    chaos = Chaos(plan, root)
    try:
        result = asyncio.run(run(chaos))
    finally:
        chaos.stop()  # idempotent: run's own clean-up may have stopped it already
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    summary = {k: result[k] for k in ("seed", "seconds", "phase_seconds", "faults_injected", "machine_faults",
                                      "service_restarts",
                                      "accepted_jobs", "final_states", "lost", "stuck", "failed_not_by_plan",
                                      "gpu_double_use",
                                      "nodes_lost_at_end",
                                      "worker_processes_seen", "audit_ok", "ok")}
    print(json.dumps(summary, indent=2, default=str))
    if not result["audit_ok"]:
        print("audit:", json.dumps({k: result["audit"].get(k) for k in
                                    ("violations_by_invariant", "first_violation", "error")}, default=str))
    for key in ("lost_jobs", "stuck_jobs", "failed_not_by_plan_jobs", "gpu_double_use_incidents"):
        if result[key]:
            print(f"{key}: {json.dumps(result[key][:10], default=str)}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
