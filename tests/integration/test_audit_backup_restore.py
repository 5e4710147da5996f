"""`corral audit verify` on a real Postgres log, and the backup/restore path of docs/operations.md:
a whole-database pg_dump restored into a new database audits the same; a dump of the events table
alone, restored into a migrated database, rebuilds the allocations table through its trigger."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import asyncpg

from corral.contracts import events as ev
from corral.contracts.envelope import Event, Reason, job_stream, node_stream
from corral.eventstore import ANY, EventStore
from corral.services.base import to_new_event
from corral.stack.servers import _pg_bin

R = Reason(code="X", message="x")


def _job(job: str, cls: type[Event], **payload: object) -> Event:
    return cls.new(stream=job_stream(job), actor="test", correlation_id=job, job_id=job, **payload)


async def _write_log(dsn: str, *, barrier_broken: bool = False) -> None:
    store = await EventStore.open(dsn, pool_size=2)
    try:
        for job, gpus in (("a", [0, 1]), ("b", [2, 3])):
            await store.append(job_stream(job), ANY, [to_new_event(e) for e in (
                _job(job, ev.JobAdmitted, queue="q", priority=0, replicas=1, gpus_per_replica=2),
                _job(job, ev.QuotaReserved, queue="q", gpus=2))])
            gang = _job(job, ev.GangReserved, ranks=[ev.RankPlacement(rank=0, node="n1", gpus=gpus)], world_size=1,
                        master_addr="h", master_port=29500 if job == "a" else 29501)
            alloc = ev.GpusAllocated.new(stream=node_stream("n1"), actor="test", correlation_id=job, node="n1",
                                         job_id=job, gpus=gpus)
            await store.append_multi({job_stream(job): (ANY, [to_new_event(gang)]),
                                      node_stream("n1"): (ANY, [to_new_event(alloc)])})
            trail = [] if barrier_broken else [_job(job, ev.WorkerStarted, rank=0, node="n1", pid=1)]
            await store.append(job_stream(job), ANY, [to_new_event(e) for e in (*trail, _job(job, ev.JobRunning))])
        # b ends: its GPUs come back
        released = _job("b", ev.GangReleased, reason=R)
        await store.append_multi({
            job_stream("b"): (ANY, [to_new_event(released), to_new_event(_job("b", ev.JobCompleted))]),
            node_stream("n1"): (ANY, [to_new_event(ev.GpusReleased.new(
                stream=node_stream("n1"), actor="test", correlation_id="b", node="n1", job_id="b", gpus=[2, 3]))])})
    finally:
        await store.close()


def _verify(dsn: str) -> tuple[int, dict[str, object]]:
    res = subprocess.run([sys.executable, "-m", "corral.cli.main", "--postgres", dsn, "audit", "verify", "--json"],
                         capture_output=True, text=True, timeout=120)
    return res.returncode, json.loads(res.stdout)


async def _new_database(dsn: str, name: str) -> str:
    base = dsn.rpartition("/")[0]
    admin = await asyncpg.connect(f"{base}/postgres")
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    return f"{base}/{name}"


async def _open_rows(dsn: str) -> list[tuple[str, int, str]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT node, gpu, job_id FROM allocations WHERE released_by IS NULL ORDER BY gpu")
    finally:
        await conn.close()
    return [(r["node"], r["gpu"], r["job_id"]) for r in rows]


async def test_audit_verify_passes_then_names_the_first_violation(postgres_dsn: str) -> None:
    await _write_log(postgres_dsn)
    code, out = _verify(postgres_dsn)
    assert code == 0 and out["ok"] and out["events"] == 15, out

    broken = await _new_database(postgres_dsn, postgres_dsn.rpartition("/")[2] + "_b")
    await _write_log(broken, barrier_broken=True)
    code, out = _verify(broken)
    first = out["first_violation"]
    assert code == 1 and not out["ok"] and isinstance(first, dict), out
    assert first["invariant"] == "GANG_PARTIAL" and first["job_id"] == "a" and first["position"] == 5, first


async def test_a_restored_dump_audits_the_same(postgres_dsn: str, tmp_path: Path) -> None:
    await _write_log(postgres_dsn)
    bin_dir = _pg_bin()
    name = postgres_dsn.rpartition("/")[2]

    # Whole database: pg_dump -Fc, pg_restore into an empty database.
    dump = tmp_path / "corral.dump"
    subprocess.run([str(bin_dir / "pg_dump"), "--format=custom", "--file", str(dump), postgres_dsn], check=True)
    restored = await _new_database(postgres_dsn, name + "_r")
    subprocess.run([str(bin_dir / "pg_restore"), "--no-owner", "--dbname", restored, str(dump)], check=True)
    code, out = _verify(restored)
    assert code == 0 and out["events"] == 15 and out["head_position"] == 15, out
    assert await _open_rows(restored) == await _open_rows(postgres_dsn) == [("n1", 0, "a"), ("n1", 1, "a")]

    # The events table alone (psql \copy, ordered by position), into a database Corral migrated: the
    # allocations trigger fires on every row and rebuilds the table. (pg_restore --data-only fails here:
    # it empties search_path and the trigger function names `allocations` unqualified.)
    csv = tmp_path / "events.csv"
    psql = str(bin_dir / "psql")
    subprocess.run([psql, postgres_dsn, "-c", f"\\copy (SELECT * FROM events ORDER BY position) TO '{csv}' CSV"],
                   check=True)
    fresh = await _new_database(postgres_dsn, name + "_e")
    await (await EventStore.open(fresh, pool_size=1)).close()  # migrations
    subprocess.run([psql, fresh, "-c", f"\\copy events FROM '{csv}' CSV", "-c",
                    "UPDATE event_log_head SET position = (SELECT COALESCE(max(position), 0) FROM events)"],
                   check=True)
    code, out = _verify(fresh)
    assert code == 0 and out["events"] == 15, out
    assert await _open_rows(fresh) == [("n1", 0, "a"), ("n1", 1, "a")]
