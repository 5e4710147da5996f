"""Reading and writing the stored view (migration 061_read_models): a snapshot plus the log's tail.

The problem: `corral jobs` folded the whole log on every call, ~20 s at a million events. Here a
question reads the snapshot of its schema (`codec.SCHEMA`: the active jobs, nodes, queues and
the position P folded), the finished jobs it asks about, and folds only the events after P.

Why this is never wrong, only slower:
- The log is the truth and the snapshot only a shortcut: the events after P are always folded,
  and positions become visible strictly in commit order (`corral.eventstore.store`: appends take
  their positions under the head lock), so "position > P" is exactly what the snapshot lacks, with
  no event committed later at a lower position. This is the relay's high-water mark too.
- A snapshot past the log's head (a log restored from an older backup) is ignored; so is one of
  another schema (other code), or one that does not decode: the log is then folded from 0.
- Snapshot, finished jobs and tail are read in one REPEATABLE READ transaction: all as of one
  moment, so a finished job's row (written with a snapshot, at its position) is never newer than
  the snapshot whose tail is folded into it.
- A finished job touched by a tail event is loaded before that event is folded (a late report
  about a job that is over must change that job, not create an empty one).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from datetime import timedelta
from typing import Any

import msgspec

from corral.contracts.envelope import Event
from corral.contracts.problems import ContractError
from corral.contracts.registry import decode
from corral.eventstore import EventStore
from corral.projection import ClusterView, JobState, JobView
from corral.readmodel.codec import SCHEMA, decode_hot, decode_job, encode_hot, encode_job, touched_jobs

log = logging.getLogger(__name__)

#: States a finished job can be stored in (`jobs --all` asks for all of them).
FINISHED = tuple(s.value for s in JobState if s.terminal)
_TAIL_BATCH = 5000


class StoredViewChanged(Exception):
    """The stored view is not the one this projector wrote last (see `write_view`)."""


class StoredPastLog(StoredViewChanged):
    """A stored job is newer than the view it would be folded into (another projector wrote it)."""


async def read_view(store: EventStore, *, job_ids: Collection[str] = (), states: Collection[str] = (),
                    schema: str = SCHEMA) -> ClusterView:
    """The cluster now: every active job, node and queue, plus the finished jobs named in
    `job_ids` or in one of `states` (not the other finished jobs: ask for them)."""
    async with store.connection() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        try:
            return await _read(conn, set(job_ids), list(states), schema)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            log.warning("the stored view (schema %s) does not decode (%s); folding the log from the start",
                        schema, exc)
            return await _read(conn, set(job_ids), list(states), schema="")


async def _read(conn: Any, job_ids: set[str], states: list[str], schema: str) -> ClusterView:
    head = int(await conn.fetchval("SELECT position FROM event_log_head WHERE id"))
    row = await conn.fetchrow("SELECT position, data FROM view_snapshots WHERE schema = $1", schema)
    if row is None or row["position"] > head:
        view = ClusterView()
        async for batch in _tail(conn, 0, head):  # no snapshot: fold as we read, as before
            for position, event in batch:
                view.apply(event, None, position)
        return view
    view = decode_hot(bytes(row["data"]))
    tail = [item async for batch in _tail(conn, view.position, head) for item in batch]
    wanted = job_ids | {j for _, event in tail for j in touched_jobs(event)}
    await _load_jobs(conn, view, schema, wanted - view.jobs.keys(), states)
    for position, event in tail:
        view.apply(event, None, position)
    view.position = max(view.position, tail[-1][0] if tail else 0)
    return view


async def _tail(conn: Any, after: int, head: int) -> Any:
    """Batches of (position, event) after `after` up to `head`; events that do not decode are skipped
    (as every reader of the log does: a ContractError names them in the services' logs)."""
    while after < head:
        rows = await conn.fetch("SELECT position, data::text AS data FROM events WHERE position > $1"
                                " AND position <= $2 ORDER BY position LIMIT $3", after, head, _TAIL_BATCH)
        if not rows:
            return
        batch: list[tuple[int, Event]] = []
        for r in rows:
            try:
                batch.append((r["position"], decode(r["data"])))
            except ContractError:
                continue
        after = rows[-1]["position"]
        yield batch


async def _load_jobs(conn: Any, view: ClusterView, schema: str, job_ids: Iterable[str],
                     states: list[str], newest: int | None = None) -> None:
    """Add the stored finished jobs named, or in `states`, that `view` does not hold (an active
    job in the snapshot is newer than any row of it). With `newest`: StoredPastLog for a row
    written after that position."""
    ids = list(job_ids)
    rows = []
    # Two statements, each on its index (one `job_id = ANY OR state = ANY` scanned the whole table).
    if ids:
        rows += await conn.fetch("SELECT job_id, position, data FROM view_jobs WHERE schema = $1"
                                 " AND job_id = ANY($2::text[])", schema, ids)
    if states:
        rows += await conn.fetch("SELECT job_id, position, data FROM view_jobs WHERE schema = $1"
                                 " AND state = ANY($2::text[])", schema, states)
    for r in rows:
        if r["job_id"] in view.jobs:
            continue
        if newest is not None and r["position"] > newest:
            raise StoredPastLog(f"job {r['job_id']} is stored as of position {r['position']}, past {newest}")
        view.jobs[r["job_id"]] = decode_job(bytes(r["data"]))


async def load_jobs(store: EventStore, view: ClusterView, job_ids: Iterable[str], schema: str = SCHEMA) -> None:
    """The projector's `_load_jobs`: finished jobs it evicted, back before an event about them."""
    async with store.connection() as conn:
        await _load_jobs(conn, view, schema, job_ids, [], newest=view.position)


async def stored_position(store: EventStore, schema: str = SCHEMA) -> int | None:
    """The position of the stored view of `schema` (None: none)."""
    async with store.connection() as conn:
        return await conn.fetchval("SELECT position FROM view_snapshots WHERE schema = $1", schema)


async def write_view(store: EventStore, view: ClusterView, finished: Iterable[JobView], *,
                     expected: int | None, schema: str = SCHEMA, encoded: dict[str, msgspec.Raw] | None = None
                     ) -> None:
    """Store `view` (its active part) and the `finished` jobs, as of `view.position`, in one
    transaction, if the stored view is still the one at `expected` (None: none) that this
    writer's jobs were stored with; StoredViewChanged otherwise, writing nothing (another
    projector wrote meanwhile, or the view was deleted with the finished jobs it had dropped:
    the writer must start again from what is stored). `encoded`: see `codec.encode_hot`."""
    rows = [(schema, j.job_id, view.position, j.state.value, j.submitted_at, encode_job(j)) for j in finished]
    hot = encode_hot(view, encoded)
    async with store.connection() as conn, conn.transaction():
        # The view first, conditionally (a concurrent writer waits for this row and then finds it
        # moved); the jobs only if it went through: raising rolls the transaction back.
        if expected is None:
            written = await conn.fetchval(
                "INSERT INTO view_snapshots (schema, position, data) VALUES ($1, $2, $3)"
                " ON CONFLICT (schema) DO NOTHING RETURNING true", schema, view.position, hot)
        else:
            written = await conn.fetchval(
                "UPDATE view_snapshots SET position = $2, data = $3, written_at = now()"
                " WHERE schema = $1 AND position = $4 RETURNING true", schema, view.position, hot, expected)
        if not written:
            raise StoredViewChanged(f"the stored view is no longer the one at {expected} this projector wrote")
        if rows:
            await conn.executemany(
                "INSERT INTO view_jobs (schema, job_id, position, state, submitted_at, data)"
                " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (schema, job_id) DO UPDATE SET"
                " position = EXCLUDED.position, state = EXCLUDED.state, submitted_at = EXCLUDED.submitted_at,"
                " data = EXCLUDED.data", rows)


async def forget_view(store: EventStore, schema: str = SCHEMA) -> None:
    """Delete the stored view of `schema` and its jobs (one past the log's head: a restored log)."""
    async with store.connection() as conn, conn.transaction():
        await conn.execute("DELETE FROM view_jobs WHERE schema = $1", schema)
        await conn.execute("DELETE FROM view_snapshots WHERE schema = $1", schema)


async def forget_other_schemas(store: EventStore, schema: str = SCHEMA, idle: timedelta = timedelta(hours=1)) -> int:
    """Delete what code of another schema stored and has not rewritten for `idle` (no process of
    this code reads it; one of that code still running would start again from its log). How many
    stored views were deleted."""
    async with store.connection() as conn, conn.transaction():
        gone = [r["schema"] for r in await conn.fetch(
            "DELETE FROM view_snapshots WHERE schema <> $1 AND written_at < now() - $2::interval RETURNING schema",
            schema, idle)]
        await conn.execute("DELETE FROM view_jobs WHERE schema = ANY($1::text[])", gone)
        # rows of a schema with no stored view at all (its view deleted before its rows were)
        await conn.execute("DELETE FROM view_jobs WHERE schema <> $1 AND NOT EXISTS"
                           " (SELECT 1 FROM view_snapshots s WHERE s.schema = view_jobs.schema)", schema)
    return len(gone)
