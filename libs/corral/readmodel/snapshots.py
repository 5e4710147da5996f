"""Reading and writing the stored view (migrations 061_read_models, 077_view_job_rows): a snapshot
plus the log's tail.

Why: a question about now must cost what its answer holds, not the log (a million events take
~20 s to fold) nor the backlog (20,000 waiting jobs, to show one). A question reads the snapshot
of its schema (`codec.SCHEMA`: the nodes, queues and ports, and the position P folded), the rows
of the jobs it asks about (one job, one page of a listing, every active job for a view of the
whole cluster, or the jobs whose released GPUs are still held for a view of the nodes), and
folds only the events after P.

Why this is never wrong, only slower:
- The log is the truth and the snapshot only a shortcut: the events after P are always folded,
  and positions become visible strictly in commit order (`corral.eventstore.store`: appends take
  their positions under the head lock), so "position > P" is exactly what the snapshot lacks, with
  no event committed later at a lower position. This is the relay's high-water mark too.
- A snapshot past the log's head (a log restored from an older backup) is ignored; so is one of
  another schema (other code), or one that does not decode: the log is then folded from 0.
- Snapshot, job rows and tail are read in one REPEATABLE READ transaction: all as of one moment,
  and every row is written with the snapshot at its position, so no row is newer than the
  snapshot whose tail is folded into it.
- A job touched by a tail event is loaded before that event is folded (a late report about a job
  that is over must change that job, not create an empty one). A job's events change only that
  job, the nodes and the ports (`ClusterView.apply`), so a view holding the nodes and some of the
  jobs folds those jobs exactly as the whole view would.
- A page of a listing is the first N matching rows as of P, ordered as the listing is; a job the
  tail touches may have moved in or out of it, so N plus the number of touched jobs are read, the
  touched ones are judged as they are after the tail, and the count is corrected by both.
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
from corral.readmodel.codec import (
    SCHEMA,
    BaseView,
    decode_base,
    decode_job,
    encode_base,
    encode_job,
    job_columns,
    touched_jobs,
)
from corral.readmodel.pages import JobFilter, first_by_submission, page_of

log = logging.getLogger(__name__)

#: States a finished job can be stored in (`jobs --all` asks for all of them).
FINISHED = tuple(s.value for s in JobState if s.terminal)
#: States of a job that is not over (every such job is active).
UNFINISHED = tuple(s.value for s in JobState if not s.terminal)
_TAIL_BATCH = 5000


class StoredViewChanged(Exception):
    """The stored view is not the one this projector wrote last (see `write_view`)."""


class StoredPastLog(StoredViewChanged):
    """A stored job is newer than the view it would be folded into (another projector wrote it)."""


async def read_view(store: EventStore, *, job_ids: Collection[str] = (), states: Collection[str] = (),
                    schema: str = SCHEMA, every_active: bool = True) -> ClusterView:
    """The cluster now: every node and queue, every active job, plus the finished jobs named in
    `job_ids` or in one of `states` (not the other finished jobs: ask for them). With
    `every_active=False`, of the jobs only those named (and those the log's tail is about)."""
    async with store.connection() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        try:
            return await _read(conn, set(job_ids), list(states), schema, every_active)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            log.warning("the stored view (schema %s) does not decode (%s); folding the log from the start",
                        schema, exc)
            return await _read(conn, set(job_ids), list(states), "", every_active)


async def read_nodes(store: EventStore, schema: str = SCHEMA) -> ClusterView:
    """Every node and queue now, and of the jobs only those whose released GPUs are still held
    (`BaseView.fenced`) and those the log's tail is about: all that each node's GPUs, allocations
    and releasing GPUs need (`corral nodes`), at the cost of the nodes, not of the active jobs."""
    async with store.connection() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        try:
            return await _read(conn, set(), [], schema, every_active=False, fenced=True)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            log.warning("the stored view (schema %s) does not decode (%s); folding the log from the start",
                        schema, exc)
            return await _read(conn, set(), [], "", every_active=False, fenced=True)


async def read_job(store: EventStore, job_id: str, schema: str = SCHEMA) -> JobView | None:
    """One job as it is now (None: the log knows no such job): its row and the log after it."""
    return (await read_view(store, job_ids=[job_id], schema=schema, every_active=False)).jobs.get(job_id)


async def read_page(store: EventStore, where: JobFilter, limit: int | None,
                    schema: str = SCHEMA) -> tuple[list[JobView], int]:
    """The first `limit` jobs (None: every one) that match `where`, oldest submission first, as
    they are now, and how many match in all."""
    async with store.connection() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        try:
            return await _page(conn, where, limit, schema)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            log.warning("the stored view (schema %s) does not decode (%s); folding the log from the start",
                        schema, exc)
            return await _page(conn, where, limit, "")


async def _based(conn: Any, schema: str) -> tuple[int, tuple[ClusterView, BaseView] | None]:
    """The log's head, and the stored view without its jobs with the `BaseView` it was made of
    (None: none usable)."""
    head = int(await conn.fetchval("SELECT position FROM event_log_head WHERE id"))
    row = await conn.fetchrow("SELECT position, data FROM view_snapshots WHERE schema = $1", schema)
    if row is None or row["position"] > head:
        return head, None
    return head, decode_base(bytes(row["data"]))


async def _whole_log(conn: Any, head: int) -> ClusterView:
    view = ClusterView()
    async for batch in _tail(conn, 0, head):  # no snapshot: fold as we read
        for position, event in batch:
            view.apply(event, None, position)
    return view


def _fold(view: ClusterView, tail: list[tuple[int, Event]]) -> None:
    for position, event in tail:
        view.apply(event, None, position)
    view.position = max(view.position, tail[-1][0] if tail else 0)


async def _read(conn: Any, job_ids: set[str], states: list[str], schema: str, every_active: bool,
                fenced: bool = False) -> ClusterView:
    """`fenced`: also the jobs whose released GPUs are still held (a fence is made and opened only
    by its own job's events, so these and the tail's jobs are every job with a fence now)."""
    head, based = await _based(conn, schema)
    if based is None:
        return await _whole_log(conn, head)
    view, base = based
    tail = [item async for batch in _tail(conn, view.position, head) for item in batch]
    if every_active:
        await _load_jobs(conn, view, schema, base.held, list(UNFINISHED))
    wanted = job_ids | {j for _, event in tail for j in touched_jobs(event)} | set(base.fenced if fenced else ())
    await _load_jobs(conn, view, schema, wanted - view.jobs.keys(), states)
    _fold(view, tail)
    return view


def _where(where: JobFilter, schema: str) -> tuple[str, list[Any]]:
    """The SQL condition on view_jobs' columns that says `where` of a row (`JobFilter.matches`)."""
    conditions: list[str] = ["schema = $1"]
    args: list[Any] = [schema]
    if where.states is not None:
        args.append(sorted(where.states))
        conditions.append(f"state = ANY(${len(args)}::text[])")
    elif not where.all_jobs:
        args.append(list(UNFINISHED))
        conditions.append(f"state = ANY(${len(args)}::text[])")
    if where.queue:
        args.append(where.queue)
        conditions.append(f"(queue = ${len(args)} OR left(queue, length(${len(args)}) + 1) = ${len(args)} || '/')")
    if where.user:
        args.append(where.user)
        conditions.append(f"user_name = ${len(args)}")
    return " AND ".join(conditions), args


async def _page(conn: Any, where: JobFilter, limit: int | None, schema: str) -> tuple[list[JobView], int]:
    head, based = await _based(conn, schema)
    if based is None:
        return page_of((await _whole_log(conn, head)).jobs.values(), where, limit)
    view, _ = based
    tail = [item async for batch in _tail(conn, view.position, head) for item in batch]
    touched = {j for _, event in tail for j in touched_jobs(event)}
    condition, args = _where(where, schema)
    more = "" if limit is None else f" LIMIT {int(limit) + len(touched)}"
    rows = await conn.fetch(f"SELECT job_id, data FROM view_jobs WHERE {condition}"
                            f" ORDER BY submitted_at, job_id COLLATE \"C\"{more}", *args)
    matched = int(await conn.fetchval(f"SELECT count(*) FROM view_jobs WHERE {condition}", *args))
    await _load_jobs(conn, view, schema, touched, [])
    matched -= sum(1 for j in touched if j in view.jobs and where.matches(view.jobs[j]))  # as of the snapshot
    _fold(view, tail)
    now = [view.jobs[j] for j in touched if j in view.jobs and where.matches(view.jobs[j])]
    untouched = [decode_job(bytes(r["data"])) for r in rows if r["job_id"] not in touched]
    return first_by_submission(untouched + now, limit), matched + len(now)


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
    """Add the stored jobs named, or in `states`, that `view` does not hold (a job in the view is
    newer than any row of it). With `newest`: StoredPastLog for a row written after that position."""
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
        job = view.jobs[r["job_id"]] = decode_job(bytes(r["data"]))
        if job.active:
            view.active[job.job_id] = job


async def load_jobs(store: EventStore, view: ClusterView, job_ids: Iterable[str], schema: str = SCHEMA) -> None:
    """The projector's `_load_jobs`: finished jobs it evicted, back before an event about them."""
    async with store.connection() as conn:
        await _load_jobs(conn, view, schema, job_ids, [], newest=view.position)


async def stored_position(store: EventStore, schema: str = SCHEMA) -> int | None:
    """The position of the stored view of `schema` (None: none)."""
    async with store.connection() as conn:
        return await conn.fetchval("SELECT position FROM view_snapshots WHERE schema = $1", schema)


async def write_view(store: EventStore, view: ClusterView, changed: Iterable[JobView], *,
                     expected: int | None, schema: str = SCHEMA) -> None:
    """Store `view` (without its jobs) and the `changed` jobs' rows, as of `view.position`, in one
    transaction, if the stored view is still the one at `expected` (None: none) that this
    writer's rows were stored with; StoredViewChanged otherwise, writing nothing (another
    projector wrote meanwhile, or the view was deleted with the rows of the jobs it had dropped:
    the writer must start again from what is stored)."""
    rows = [(schema, j.job_id, view.position, *job_columns(j), encode_job(j)) for j in changed]
    base = encode_base(view)
    async with store.connection() as conn, conn.transaction():
        # The view first, conditionally (a concurrent writer waits for this row and then finds it
        # moved); the jobs only if it went through: raising rolls the transaction back.
        if expected is None:
            written = await conn.fetchval(
                "INSERT INTO view_snapshots (schema, position, data) VALUES ($1, $2, $3)"
                " ON CONFLICT (schema) DO NOTHING RETURNING true", schema, view.position, base)
        else:
            written = await conn.fetchval(
                "UPDATE view_snapshots SET position = $2, data = $3, written_at = now()"
                " WHERE schema = $1 AND position = $4 RETURNING true", schema, view.position, base, expected)
        if not written:
            raise StoredViewChanged(f"the stored view is no longer the one at {expected} this projector wrote")
        if rows:
            await conn.executemany(
                "INSERT INTO view_jobs (schema, job_id, position, state, submitted_at, queue, user_name, data)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (schema, job_id) DO UPDATE SET"
                " position = EXCLUDED.position, state = EXCLUDED.state, submitted_at = EXCLUDED.submitted_at,"
                " queue = EXCLUDED.queue, user_name = EXCLUDED.user_name, data = EXCLUDED.data", rows)


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
