"""Benchmark the event store and the outbox relay on embedded Postgres and nats-server.

Measures: single-event appends/s with one appender and with many concurrent appenders (distinct
streams; appends are serialised by the head lock, so this shows the cost of that design),
10-event appends (and, when it starts its own Postgres, the CPU Postgres spent per append),
read_all events/s, and outbox relay events/s into JetStream (the dev stack's
sync_interval, 1 s; CORRAL_NATS_SYNC=always fsyncs every publish, see
`corral.stack.servers.NatsServer.sync_interval`). Uses CORRAL_POSTGRES_DSN / CORRAL_NATS_URL when set.

    .venv/bin/python bench/eventstore.py [--events 2000] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import secrets
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
from live import tree_cpu  # bench/live.py
from machine_probe import probe_line

from corral.bus import Bus, OutboxRelay
from corral.eventstore import ANY, EventStore, NewEvent
from corral.stack.servers import NatsServer, PostgresServer

_DATA = b'{"job": "j-1", "gpus": 8, "queue": "research", "priority": 5, "labels": {"team": "vision"}}'


def _event(stream: str) -> NewEvent:
    return NewEvent(event_id=str(uuid.uuid4()), stream=stream, type="JobSubmitted", schema_version=1,
                    data=_DATA, correlation_id=stream, causation_id=None, occurred_at=datetime.now(UTC))


async def _timed(label: str, count: int, work: Callable[[], Awaitable[object]], *,
                 postgres_pid: int | None = None, appends: int | None = None) -> None:
    """Run `work` and print its rate; with `postgres_pid` and `appends`, also the CPU the Postgres
    server (its backends included) spent per append."""
    cpu = tree_cpu(postgres_pid) if postgres_pid is not None else 0.0
    start = time.perf_counter()
    await work()
    elapsed = time.perf_counter() - start
    line = f"{label:<52} {count / elapsed:>10,.0f} /s   ({count} in {elapsed:.2f} s)"
    if postgres_pid is not None and appends:
        line += f"   Postgres CPU {(tree_cpu(postgres_pid) - cpu) / appends * 1e3:.2f} ms per append"
    print(line)


async def _fresh_database(server_dsn: str) -> str:
    name = f"bench_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(server_dsn.rpartition("/")[0] + "/postgres")
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    return server_dsn.rpartition("/")[0] + "/" + name


async def run(events: int, concurrency: int, pg_dsn: str, nats_url: str, postgres_pid: int | None = None) -> None:
    store = await EventStore.open(await _fresh_database(pg_dsn), pool_size=max(concurrency, 4))
    try:
        async def sequential() -> None:
            for i in range(events):
                await store.append(f"job-s{i}", 0, [_event(f"job-s{i}")])

        async def concurrent() -> None:
            per_task = events // concurrency

            async def appender(t: int) -> None:
                for i in range(per_task):
                    await store.append(f"job-c{t}-{i}", 0, [_event(f"job-c{t}-{i}")])

            await asyncio.gather(*(appender(t) for t in range(concurrency)))

        async def batched() -> None:
            for i in range(events // 10):
                stream = f"job-b{i}"
                await store.append(stream, ANY, [_event(stream) for _ in range(10)])

        async def read_everything() -> None:
            after = 0
            while batch := await store.read_all(after, limit=1000):
                after = batch[-1].position

        pid = postgres_pid
        await _timed("append, 1 event, 1 appender", events, sequential, postgres_pid=pid, appends=events)
        await _timed(f"append, 1 event, {concurrency} concurrent appenders", events // concurrency * concurrency,
                     concurrent, postgres_pid=pid, appends=events // concurrency * concurrency)
        await _timed("append, 10 events per append (events/s)", events // 10 * 10, batched,
                     postgres_pid=pid, appends=events // 10)
        total = await store.head_position()
        await _timed("read_all, pages of 1000 (events/s)", total, read_everything)

        bus = await Bus.connect(nats_url, namespace=f"bench{secrets.token_hex(3)}")
        try:
            await bus.ensure_streams()
            relay = OutboxRelay(store, bus, lambda e: bus.names.events_subject(e.type))
            await _timed("outbox relay into JetStream (events/s)", total, relay.publish_pending)
        finally:
            await bus.close()
    finally:
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run (seconds) checking the script end to end (the test suite)")
    args = parser.parse_args()
    print(probe_line(), flush=True)
    if args.smoke:  # the test suite's size: runs end to end in seconds
        args.events, args.concurrency = 200, 2
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}")
    with tempfile.TemporaryDirectory() as tmp:
        pg = nats = None
        pg_dsn = os.environ.get("CORRAL_POSTGRES_DSN")
        nats_url = os.environ.get("CORRAL_NATS_URL")
        try:
            if not pg_dsn:
                pg = PostgresServer(Path(tmp) / "pg").start()
                pg_dsn = pg.dsn
            if not nats_url:
                nats = NatsServer(Path(tmp) / "nats").start()
                nats_url = nats.url
            asyncio.run(run(args.events, args.concurrency, pg_dsn, nats_url,
                            postgres_pid=pg.proc.pid if pg is not None and pg.proc is not None else None))
        finally:
            if nats is not None:
                nats.stop()
            if pg is not None:
                pg.stop()


if __name__ == "__main__":
    main()
