"""What the process holding the relay and projector leases costs per event, and Postgres with it.

Why: in bench/e2e.py the lease holder (mostly the placement standby) and Postgres are two of the
largest CPU users per job, and on a shared machine a whole stack falls behind and measures its
backlog. This runs only their part: jobs' events (~14 a job, as the live system writes them) are
appended at `--rate` jobs a second by four appenders (about two events an append, a job's events
in order, commits not waiting for the disk), while one child process relays them to JetStream
(TLS, node work included, `corral.services.relay.service_relay`) and keeps the read
model current (`corral.readmodel.projector`), as the lease holder does. Printed per event: the
child's CPU, Postgres' (the appends with their triggers, the relay's and projector's reads and
writes) and nats-server's, and Postgres' work counted (commits, rows read and written, buffers):
on a loaded machine the counts tell two runs apart where the CPU seconds do not.

    .venv/bin/python bench/relay_holder.py [--rate 100] [--seconds 10] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from live import machine_line, tree_cpu
from readmodel import LogBuilder

from corral.bus import Bus
from corral.eventstore import ANY, EventStore, NewEvent
from corral.readmodel.projector import Projector
from corral.services.relay import service_relay
from corral.stack import tls
from corral.stack.servers import NatsServer, PostgresServer

NAMESPACE = "bench"
APPENDERS = 4


def _jobs(count: int, nodes: int) -> tuple[list[NewEvent], list[list[NewEvent]]]:
    """The cluster's setup events, and each job's events in order."""
    builder = LogBuilder(total=count * 20 + 1000, nodes=nodes)
    builder.setup()
    setup = len(builder.records)
    starts = []
    for i in range(count):
        starts.append(len(builder.records))
        job, queue = builder.submit()
        node = builder.place(job, queue)
        builder.finish(job, queue, node, failed=i % 17 == 0)
    events = [NewEvent(event_id=r[3], stream=r[0], type=r[4], schema_version=r[5], data=r[6].encode(),
                       correlation_id=r[7], causation_id=None, occurred_at=r[9]) for r in builder.records]
    bounds = [*starts, len(events)]
    return events[:setup], [events[a:b] for a, b in itertools.pairwise(bounds)]


def _appends(events: list[NewEvent]) -> list[list[NewEvent]]:
    """A job's events as the services append them: about two an append, each of one stream."""
    out: list[list[NewEvent]] = []
    for event in events:
        if out and len(out[-1]) < 2 and out[-1][0].stream == event.stream:
            out[-1].append(event)
        else:
            out.append([event])
    return out


async def _append(dsn: str, setup: list[NewEvent], jobs: list[list[NewEvent]], rate: float) -> float:
    """Append every job's events, a job started every 1/rate s; the seconds it took."""
    store = await EventStore.open(dsn, pool_size=APPENDERS)
    try:
        for event in setup:
            await store.append(event.stream, ANY, [event])
        started = time.perf_counter()

        async def appender(k: int) -> None:
            for i in range(k, len(jobs), APPENDERS):
                delay = started + i / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                for pair in _appends(jobs[i]):
                    await store.append(pair[0].stream, ANY, pair)

        await asyncio.gather(*(appender(k) for k in range(APPENDERS)))
        return time.perf_counter() - started
    finally:
        await store.close()


async def _hold(dsn: str, nats_url: str, ca: str) -> None:
    """The child: relay and project until told the head, then print its CPU since it was ready."""
    store = await EventStore.open(dsn)
    bus = await Bus.connect(nats_url, NAMESPACE, ca=ca)
    await bus.ensure_streams()
    relay = service_relay(store, bus, NAMESPACE)
    projector = Projector(store)
    tasks = [relay.start(), asyncio.create_task(projector.run())]
    cpu = time.process_time()
    print("ready", flush=True)
    head = int(await asyncio.to_thread(sys.stdin.readline))
    while projector.view.position < head or await store.relay_position("relay") < head:
        for task in tasks:
            if task.done():
                task.result()
        await asyncio.sleep(0.05)
    used = time.process_time() - cpu
    await relay.stop()
    tasks[1].cancel()
    print(json.dumps({"cpu": used, "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}), flush=True)
    await bus.close()
    await store.close()


async def _migrate(dsn: str) -> None:
    """Migrate, and commit without waiting for the disk: the appends measure CPU, not this machine's
    fsync (a loaded machine's would hold them to a few hundred a second)."""
    store = await EventStore.open(dsn)
    await store.close()
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("ALTER SYSTEM SET synchronous_commit = off")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


async def _database_work(dsn: str) -> dict[str, int]:
    """The database's counters of work done so far (commits, rows read and written, buffers)."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow("SELECT xact_commit AS commits, tup_returned AS rows_scanned,"
                                  " tup_fetched AS rows_fetched, tup_inserted AS inserted, tup_updated AS updated,"
                                  " blks_hit + blks_read AS buffers FROM pg_stat_database"
                                  " WHERE datname = current_database()")
        return dict(row)
    finally:
        await conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=100.0, help="jobs a second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--smoke", action="store_true", help="a few jobs: checks the bench runs")
    parser.add_argument("--hold", nargs=3, metavar=("DSN", "NATS", "CA"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hold:
        asyncio.run(_hold(*args.hold))
        return 0
    if args.smoke:
        args.rate, args.seconds = 20.0, 1.0
    setup, jobs = _jobs(round(args.rate * args.seconds), args.nodes)
    root = Path(tempfile.mkdtemp(prefix="corral-bench-relay-"))
    files = tls.generate(root / "tls")
    pg = PostgresServer(root / "pg").start()
    nats = NatsServer(data_dir=root / "nats", tls=files.server_block()).start()
    try:
        assert pg.proc is not None and nats.proc is not None
        asyncio.run(_migrate(pg.dsn))
        child = subprocess.Popen([sys.executable, __file__, "--hold", pg.dsn, nats.url, str(files.ca)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert child.stdin is not None and child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        pg0, nats0, work0 = tree_cpu(pg.proc.pid), tree_cpu(nats.proc.pid), asyncio.run(_database_work(pg.dsn))
        took = asyncio.run(_append(pg.dsn, setup, jobs, args.rate))
        events = len(setup) + sum(len(j) for j in jobs)
        child.stdin.write(f"{events}\n")
        child.stdin.flush()
        held = json.loads(child.stdout.readline())
        child.wait(timeout=60)
        pg_cpu, nats_cpu = tree_cpu(pg.proc.pid) - pg0, tree_cpu(nats.proc.pid) - nats0
        time.sleep(1.5)  # the statistics of the last transactions reach pg_stat_database within a second
        work = {k: v - work0[k] for k, v in asyncio.run(_database_work(pg.dsn)).items()}
    finally:
        nats.stop()
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"machine: {machine_line()}")
    print(f"command: {' '.join([os.path.relpath(sys.argv[0]), *sys.argv[1:]])}")
    print(f"{len(jobs)} jobs, {events} events appended in {took:.1f} s ({len(jobs) / took:.0f} jobs/s), ~2 events "
          f"an append, {APPENDERS} appenders")
    print(f"  per event (us): relay + projector holder {held['cpu'] / events * 1e6:.0f}, postgres "
          f"{pg_cpu / events * 1e6:.0f}, nats-server {nats_cpu / events * 1e6:.0f}")
    print(f"  per job (ms):   relay + projector holder {held['cpu'] / len(jobs) * 1e3:.2f}, postgres "
          f"{pg_cpu / len(jobs) * 1e3:.2f}, nats-server {nats_cpu / len(jobs) * 1e3:.2f}")
    print("  per event, Postgres' work (pg_stat_database): " + ", ".join(
        f"{k} {v / events:.2f}" for k, v in work.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
