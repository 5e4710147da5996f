"""Benchmark the CLI's questions on a big log: `corral jobs`, `nodes`, `queues`, `why`.

Builds a log of `--events` events in a fresh database (bulk COPY, not through the services: a
million events through the services would take hours): nodes and queues registered, then jobs
that ran to the end (completed, a few failed or cancelled, ~14 events each, as the live system
writes them), then one running gang per node and jobs waiting for GPUs. The projector
(`corral.readmodel.projector`) folds the log up to `--tail` events before its end and stores the
view; the last `--tail` events are appended after it, as if written since the last snapshot.

Each command then runs in-process through the real CLI (click's runner on the command tree typer
builds once, as a `corral` process does at start; output discarded):
"after" reads the read model (snapshot + tail), timed as a table and with `--json`; "before"
folds the whole log, as every one of these commands did before (the old `Client.view()`), timed
once with `--json`. Both JSON answers are compared and must agree. Also printed: the wall time
of one `corral jobs` in a fresh process (Python start-up and imports included) and how long the
projector took to fold the whole log.

    .venv/bin/python bench/readmodel.py [--events 1000000] [--tail 1000] [--repeat 5] [--no-before]
    .venv/bin/python bench/readmodel.py --smoke      # 3,000 events, the test suite's size

Uses CORRAL_POSTGRES_DSN (a superuser: COPY with triggers off) when set, else an embedded Postgres.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import typer
from click.testing import CliRunner
from machine_probe import probe_line

from corral.cli.main import app
from corral.client import Client
from corral.contracts import events as ev
from corral.contracts.cluster import parse_cluster_shorthand
from corral.contracts.envelope import Event, Reason, job_stream, node_stream, queue_stream
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.queues import QueueSpec
from corral.contracts.registry import encode
from corral.eventstore import EventStore
from corral.eventstore.chain import ChainRow, chain_hash
from corral.readmodel.projector import Projector
from corral.readmodel.snapshots import read_view
from corral.stack.servers import PostgresServer

QUEUES = ("research", "prod", "batch")
_COLUMNS = ["stream", "version", "position", "event_id", "type", "schema_version", "data", "correlation_id",
            "causation_id", "occurred_at", "recorded_at", "hash"]
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class LogBuilder:
    """Events in log order, with their stream versions, positions, times and hash chain."""

    def __init__(self, total: int, nodes: int) -> None:
        self.total, self.nodes = total, nodes
        self.versions: dict[str, int] = {}
        self.now = datetime.now(UTC) - timedelta(milliseconds=total)
        self.records: list[tuple[Any, ...]] = []
        self.previous: bytes | None = None
        self.jobs = 0

    def add(self, cls: type[Event], stream: str, correlation: str | None = None, **payload: Any) -> None:
        self.now += timedelta(milliseconds=1)
        event = cls.new(stream=stream, actor="bench", correlation_id=correlation, now=self.now, **payload)
        version = self.versions[stream] = self.versions.get(stream, 0) + 1
        position = len(self.records) + 1
        data = encode(event).decode()
        occurred_us = (event.occurred_at - _EPOCH) // timedelta(microseconds=1)
        row = ChainRow(position, stream, version, event.event_id, event.type, event.schema_version, correlation,
                       None, occurred_us, data, None)
        self.previous = chain_hash(self.previous, row)
        self.records.append((stream, version, position, event.event_id, event.type, event.schema_version, data,
                             correlation, None, event.occurred_at, event.occurred_at, self.previous))

    @property
    def room(self) -> int:
        return self.total - len(self.records)

    def setup(self) -> None:
        for inv in parse_cluster_shorthand(f"{self.nodes}x8:H100").inventories():
            self.add(ev.NodeRegistered, node_stream(inv.node), node=inv.node, gpus=inv.gpus,
                     nvlink_domains=inv.nvlink_domains, rack=inv.rack, zone=inv.zone)
        per = self.nodes * 8 // len(QUEUES)
        for name in QUEUES:
            self.add(ev.QueueConfigured, queue_stream(name), name,
                     queue=QueueSpec(name=name, guaranteed_gpus=per, max_gpus=self.nodes * 8))

    def submit(self) -> tuple[str, str]:
        self.jobs += 1
        job, queue = f"j{self.jobs:09d}", QUEUES[self.jobs % len(QUEUES)]
        spec = validate_job_spec({"name": f"train-{self.jobs % 97}", "queue": queue, "replicas": 2,
                                  "gpus_per_replica": 4, "runtime": "sim", "duration_seconds": 600})
        self.add(ev.JobSubmitted, job_stream(job), job, job_id=job, spec=spec, user=f"user{self.jobs % 13}")
        self.add(ev.JobAdmitted, job_stream(job), job, job_id=job, queue=queue, priority=500, replicas=2,
                 gpus_per_replica=4)
        return job, queue

    def place(self, job: str, queue: str) -> str:
        s, node = job_stream(job), f"node-{self.jobs % self.nodes}"
        self.add(ev.QuotaReserved, s, job, job_id=job, queue=queue, gpus=8)
        ranks = [ev.RankPlacement(rank=r, node=node, gpus=[4 * r + g for g in range(4)]) for r in (0, 1)]
        self.add(ev.GangReserved, s, job, job_id=job, ranks=ranks, world_size=2, master_addr="127.0.0.1",
                 master_port=29500)
        self.add(ev.GpusAllocated, node_stream(node), job, node=node, job_id=job, gpus=list(range(8)))
        for r in (0, 1):
            self.add(ev.WorkerStarted, s, job, job_id=job, rank=r, node=node, pid=1000 + r)
        self.add(ev.JobRunning, s, job, job_id=job)
        return node

    def finish(self, job: str, queue: str, node: str, failed: bool) -> None:
        s = job_stream(job)
        code = "WORKER_FAILED" if failed else "COMPLETED"
        for r in (0, 1):
            self.add(ev.WorkerExited, s, job, job_id=job, rank=r, node=node, exit_code=1 if failed and r else 0,
                     reason=Reason(code="EXITED", message="exited"))
        self.add(ev.GangReleased, s, job, job_id=job, reason=Reason(code=code, message=code.lower()))
        if failed:
            self.add(ev.JobFailed, s, job, job_id=job, reason=Reason(code=code, message="rank 1 exited 1"))
        else:
            self.add(ev.JobCompleted, s, job, job_id=job)
        self.add(ev.GpusReleased, node_stream(node), job, node=node, job_id=job, gpus=list(range(8)))
        self.add(ev.QuotaReleased, s, job, job_id=job, queue=queue, gpus=8,
                 reason=Reason(code="RELEASED", message="released"))

    def wait(self, job: str) -> None:
        self.add(ev.PlacementPending, job_stream(job), job, job_id=job,
                 reason=Reason(code="INSUFFICIENT_GPUS", message="needs 8 free GPUs on one node; 0 are free"))

    def build(self, pending: int) -> list[tuple[Any, ...]]:
        self.setup()
        end_phase = self.nodes * 9 + pending * 3 + 20
        while self.room > end_phase:  # the history: jobs that ran to the end
            job, queue = self.submit()
            if self.jobs % 20 == 0:  # cancelled while waiting
                self.wait(job)
                self.add(ev.JobCancelled, job_stream(job), job, job_id=job,
                         reason=Reason(code="CANCELLED", message=f"cancelled by user{self.jobs % 13}"))
                continue
            node = self.place(job, queue)
            self.finish(job, queue, node, failed=self.jobs % 20 == 1)
        for _ in range(self.nodes):  # one running gang per node
            job, queue = self.submit()
            self.place(job, queue)
        while self.room >= 3:  # waiting for GPUs
            job, _ = self.submit()
            self.wait(job)
        while self.room:  # the exact count: the last job's reason said again
            self.wait(job)
        return self.records


async def _copy(conn: asyncpg.Connection, records: list[tuple[Any, ...]]) -> None:
    await conn.execute("SET session_replication_role = replica")  # no triggers: the hash is computed above
    for i in range(0, len(records), 50_000):
        await conn.copy_records_to_table("events", records=records[i:i + 50_000], columns=_COLUMNS)
    await conn.execute("UPDATE event_log_head SET position = $1 WHERE id", records[-1][2])
    await conn.execute("SET session_replication_role = origin")


_COMMAND = typer.main.get_command(app)  # built once, as a `corral` process does at start


def _timed_cli(args: list[str], repeat: int) -> tuple[list[float], Any]:
    runner, times, out = CliRunner(), [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = runner.invoke(_COMMAND, args)  # type: ignore[arg-type]  # typer vendors click: same API
        times.append(time.perf_counter() - started)
        assert result.exit_code == 0, (args, result.output[-2000:], result.exception)
        out = result.output
    return times, out


def _comparable(args: list[str], output: str) -> Any:
    data = json.loads(output)
    if args[0] == "jobs":
        return [{k: v for k, v in row.items() if k != "age"} for row in data]
    if args[0] == "why":
        return {"state": data["state"], "trail": len(data["trail"]), "blocker": (data["blocker"] or {}).get("code")}
    return data


async def _fresh_database(server_dsn: str) -> str:
    name = f"bench_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(server_dsn.rpartition("/")[0] + "/postgres")
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    return server_dsn.rpartition("/")[0] + "/" + name


async def build(dsn: str, events: int, tail: int, nodes: int, pending: int) -> tuple[list[str], float]:
    started = time.perf_counter()
    records = LogBuilder(events, nodes).build(pending)
    print(f"generated {len(records):,} events in {time.perf_counter() - started:.1f} s", flush=True)
    store = await EventStore.open(dsn)
    try:
        async with store.connection() as conn:
            started = time.perf_counter()
            await _copy(conn, records[:len(records) - tail])
            print(f"COPY of {len(records) - tail:,} events: {time.perf_counter() - started:.1f} s", flush=True)
            started, cpu = time.perf_counter(), time.process_time()
            await Projector(store).catch_up()
            projected, cpu = time.perf_counter() - started, time.process_time() - cpu
            print(f"projector folded {len(records) - tail:,} events and stored the view: {projected:.1f} s "
                  f"({cpu:.1f} s CPU in this process: {1e6 * cpu / (len(records) - tail):.0f} us per event)",
                  flush=True)
            await _copy(conn, records[len(records) - tail:])
    finally:
        await store.close()
    jobs = sorted({r[7] for r in records if r[4] == "JobSubmitted"})
    return jobs, projected


def _commands(jobs: list[str]) -> Iterator[tuple[str, list[str]]]:
    yield "jobs", ["jobs"]
    yield "nodes", ["nodes"]
    yield "queues", ["queues"]
    yield "why (waiting job)", ["why", jobs[-1]]
    yield "why (finished job)", ["why", jobs[len(jobs) // 2]]
    yield "jobs --state FAILED", ["jobs", "--state", "FAILED"]


def measure(dsn: str, jobs: list[str], repeat: int, before: bool) -> list[dict[str, Any]]:
    base = ["--postgres", dsn, "--nats", "nats://127.0.0.1:1"]
    rows = []
    live_view = Client.live_view
    for label, args in _commands(jobs):
        after_times, _ = _timed_cli([*base, *args], repeat)
        json_times, after_json = _timed_cli([*base, *args, "--json"], repeat)
        row: dict[str, Any] = {"command": label, "after_median_ms": 1000 * statistics.median(after_times),
                               "after_max_ms": 1000 * max(after_times),
                               "after_json_median_ms": 1000 * statistics.median(json_times)}
        if before:
            async def whole_log(self: Client, **_: Any) -> Any:
                return await self.view()
            Client.live_view = whole_log  # type: ignore[method-assign,unused-ignore]
            try:
                before_times, before_json = _timed_cli([*base, *args, "--json"], 1)
            finally:
                Client.live_view = live_view  # type: ignore[method-assign,unused-ignore]
            row["before_json_ms"] = 1000 * before_times[0]
            same = _comparable(args, after_json) == _comparable(args, before_json)
            assert same, f"{label}: the read model's answer differs from the whole log's"
            row["same_answer"] = same
        rows.append(row)
        print(f"{label:<22} after {row['after_median_ms']:>7.1f} ms median (max {row['after_max_ms']:>7.1f}),"
              f" --json {row['after_json_median_ms']:>7.1f} ms"
              + (f"   before (--json) {row['before_json_ms']:>9.1f} ms, same answer" if before else ""), flush=True)
    return rows


async def data_path(dsn: str, repeat: int) -> dict[str, float]:
    """The read alone, without the CLI around it: open the store as the CLI does, read the view."""
    opened, read = [], []
    for _ in range(repeat):
        started = time.perf_counter()
        store = await EventStore.open(dsn, pool_size=4, min_size=1)
        opened.append(time.perf_counter() - started)
        started = time.perf_counter()
        view = await read_view(store)
        read.append(time.perf_counter() - started)
        await store.close()
    return {"open_ms": 1000 * statistics.median(opened), "read_view_ms": 1000 * statistics.median(read),
            "active_jobs": len(view.active)}


def process_wall(dsn: str, *args: str) -> float:
    env = {**os.environ, "CORRAL_POSTGRES_DSN": dsn, "CORRAL_NATS_URL": "nats://127.0.0.1:1"}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "corral.cli.main", *args], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--tail", type=int, default=1000,
                        help="events appended after the last snapshot (the projector writes every 1,000)")
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--pending", type=int, default=1000, help="jobs waiting for GPUs at the end")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-before", action="store_true", help="skip the whole-log fold (slow at 1M)")
    parser.add_argument("--smoke", action="store_true", help="3,000 events, 100 waiting, 8 nodes")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    print(probe_line(), flush=True)
    if args.smoke:
        args.events, args.tail, args.nodes, args.pending, args.repeat = 3_000, 300, 8, 100, 1
    with tempfile.TemporaryDirectory(prefix="corral-bench-readmodel-") as tmp:
        server = None
        server_dsn = os.environ.get("CORRAL_POSTGRES_DSN")
        if not server_dsn:
            server = PostgresServer(Path(tmp) / "pg").start()
            server_dsn = server.dsn
        try:
            dsn = asyncio.run(_fresh_database(server_dsn))
            jobs, projected = asyncio.run(build(dsn, args.events, args.tail, args.nodes, args.pending))
            path = asyncio.run(data_path(dsn, args.repeat))
            print(f"data path: open the store {path['open_ms']:.1f} ms, read_view {path['read_view_ms']:.1f} ms"
                  f" ({path['active_jobs']} active jobs, {args.tail} events of tail), medians", flush=True)
            rows = measure(dsn, jobs, args.repeat, before=not args.no_before)
            wall = process_wall(dsn, "jobs")
            bare = process_wall(dsn, "--help") if not args.smoke else float("nan")
            print(f"`corral jobs` in a fresh process (start-up and imports included): {wall * 1000:.0f} ms;"
                  f" `corral --help`: {bare * 1000:.0f} ms")
        finally:
            if server is not None:
                server.stop()
    if args.json:
        args.json.write_text(json.dumps({
            "events": args.events, "tail": args.tail, "nodes": args.nodes, "pending": args.pending,
            "projector_full_fold_s": projected, "data_path": path, "commands": rows,
            "process_wall_jobs_ms": wall * 1000, "process_wall_help_ms": bare * 1000,
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count()}}, indent=2))


if __name__ == "__main__":
    main()
