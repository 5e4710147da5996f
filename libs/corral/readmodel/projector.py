"""The projector: folds the log as it grows and stores the view for the CLI (`snapshots`).

Why: a stored view helps only while it is recent (a reader folds every event after it).
The projector follows the log in position order (the same safe high-water mark as the relay:
positions are commit-ordered), folds each event once, and stores the view after enough events
or time: by default every 1,000 events or 1 s, whichever comes first, and never more often than
ten times the last write took, up to 10 s (a slow database must not take a core). A write stores
the nodes, queues and ports (`codec.encode_base`) and the rows of the jobs that changed since the
last one: its cost follows what changed, not the backlog.

It keeps only active jobs in memory: a job that is over is stored in `view_jobs` with the next
snapshot and dropped, and loaded back if a later event is about it. It resumes from its own
snapshot, so a restart costs one tail, not the log. The services run it under a lease (one at a
time; `services/projector_lease.py`); two at once stay correct: each writes only over the view it wrote
last (`write_view`), and starts again from what is stored when another wrote meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from corral.contracts import events as ev
from corral.contracts.envelope import Event
from corral.contracts.problems import ContractError
from corral.contracts.registry import decode
from corral.eventstore import EventStore, StoredEvent
from corral.projection import ClusterView
from corral.readmodel.codec import SCHEMA, touched_jobs
from corral.readmodel.snapshots import (
    StoredViewChanged,
    forget_other_schemas,
    forget_view,
    load_jobs,
    read_view,
    stored_position,
    write_view,
)

log = logging.getLogger(__name__)


@dataclass
class Projector:
    store: EventStore
    every_events: int = 1000
    every_seconds: float = 1.0
    poll_seconds: float = 0.25
    #: The most the ten-times rule may hold a write back (one long write must not stop them all).
    max_gap_seconds: float = 10.0
    batch: int = 1000
    schema: str = SCHEMA
    view: ClusterView = field(default_factory=ClusterView)
    #: Jobs changed since the last write (their rows are written with it).
    dirty: set[str] = field(default_factory=set)
    unwritten: int = 0
    written_at: float = 0.0
    write_seconds: float = 0.0
    #: The position of the stored view this projector wrote last, or resumed from (None: none).
    stored: int | None = None

    async def resume(self) -> None:
        """Start from the stored view of this schema (and its tail), forgetting other schemas' old
        ones. With none stored, fold from the start of the log, storing as it goes (memory stays
        O(active jobs), and the first write is not the whole history at once). A stored view past
        the log's head (a log restored from an older backup) is deleted with its jobs."""
        await forget_other_schemas(self.store, self.schema)
        self.stored = await stored_position(self.store, self.schema)
        if self.stored is not None and self.stored > await self.store.head_position():
            log.warning("projector: the stored view is past the log's head (a restored log?); folding again")
            await forget_view(self.store, self.schema)
            self.stored = None
        self.view = ClusterView() if self.stored is None else await read_view(self.store, schema=self.schema)
        self.dirty = set(self.view.jobs)
        self.unwritten = 1  # write once at start: the tail just folded becomes the snapshot
        self.written_at = 0.0

    async def fold(self, batch: list[StoredEvent]) -> None:
        """Fold `batch` (the next events of the log, in position order)."""
        events: list[tuple[int, Event]] = []
        for stored in batch:
            try:
                events.append((stored.position, decode(stored.data)))
            except ContractError:
                continue
        touched = {j for _, event in events for j in touched_jobs(event)}
        # A job submitted in this batch has no row yet: its submission is its first event.
        missing = touched - self.view.jobs.keys() - {e.job_id for _, e in events if isinstance(e, ev.JobSubmitted)}
        if missing:
            await load_jobs(self.store, self.view, missing, self.schema)
        for position, event in events:
            self.view.apply(event, None, position)
        self.dirty |= touched
        self.unwritten += len(batch)
        if batch:
            self.view.position = max(self.view.position, batch[-1].position)

    def due(self, now: float) -> bool:
        if not self.unwritten or now - self.written_at < min(10 * self.write_seconds, self.max_gap_seconds):
            return False
        return self.unwritten >= self.every_events or now - self.written_at >= self.every_seconds

    async def write(self) -> None:
        """Store the view and every job changed since the last write, then forget the jobs that are over."""
        started = time.monotonic()
        view = self.view
        changed = [view.jobs[j] for j in self.dirty if j in view.jobs]
        finished = [j for j in changed if j.job_id not in view.active]
        await write_view(self.store, view, changed, expected=self.stored, schema=self.schema)
        self.stored = view.position
        for job in finished:
            del view.jobs[job.job_id]
        view.submissions.clear()
        view.versions.clear()
        self.dirty.clear()
        self.unwritten = 0
        self.written_at = time.monotonic()
        self.write_seconds = self.written_at - started

    async def step(self) -> int:
        """Fold what the log holds next (one batch), write if due; how many events were read."""
        batch = await self.store.read_all(self.view.position, limit=self.batch)
        await self.fold(batch)
        if self.due(time.monotonic()):
            await self.write()
        return len(batch)

    async def catch_up(self) -> None:
        """Fold the log to its head and write (what a bench or a test calls)."""
        while await self.step() == self.batch:
            pass
        if self.unwritten:
            await self.write()

    async def run(self) -> None:
        """Resume, then follow the log forever (cancel the task to stop)."""
        await self.resume()
        log.info("projector: stored view (schema %s) at position %d", self.schema, self.view.position)
        while True:
            try:
                if await self.step() < self.batch:
                    await asyncio.sleep(self.poll_seconds)
            except StoredViewChanged as exc:  # another projector wrote meanwhile
                log.warning("projector: %s; resuming from the stored view", exc)
                await self.resume()
