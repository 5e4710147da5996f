"""Placement: the only writer of GPU allocations, and the keeper of node and gang lifecycles.

Exactly one instance is active: it holds the `placement` lease (a Postgres advisory lock); a
standby blocks on it and takes over, rebuilding from the log, when the holder dies.

Each reconcile:
1. nodes: a node whose heartbeats stopped for `lost_after` seconds is lost; its gangs are
   released and requeued from their last checkpoint;
2. gangs: all ranks started → JobRunning; the start barrier expired → release and requeue;
   every rank exited 0 → JobCompleted; a rank crashed → restart from the checkpoint or fail;
   a preempted gang fully stopped → GangReleased (preemption then requeues it);
3. placement: the core's `schedule` over jobs holding quota → GangReserved, written together
   with a GpusAllocated per node (node streams at their expected versions; the allocations
   table's unique index refuses a GPU held twice), or PlacementPending when the reason changes.

Node agents have no database: placement records their reports (NodeRegistered, WorkerStarted,
WorkerExited, CheckpointDone) from the inbox, each exactly once (tracking rows).
"""

from __future__ import annotations

import logging
import os
import time
import zlib
from collections.abc import Sequence
from typing import Any

import asyncpg
import msgspec

from corral import core
from corral.bus import Delivery, Retry
from corral.contracts import events as ev
from corral.contracts.envelope import Event, Reason, job_stream, node_stream
from corral.contracts.subjects import NODE_REPORT_TYPES, Subjects
from corral.eventstore import Tracking
from corral.projection import JobState, JobView
from corral.services.placement.report_auth import report_refused
from corral.services.runtime import Service
from corral.translate import wire_reason

log = logging.getLogger("corral.placement")

CHECKPOINTED_EXIT = 85  # corral.worker's "stopped after a checkpoint" exit code


class Placement(Service):
    name = "placement"
    lease = "placement"
    #: `node.*.<Report>`: reports on a subject naming the node that sent them (a node identity may
    #: publish only its own, see `corral.bus.auth`); the bare subjects only a superuser may publish.
    inbox = ("NodeRegistered", "WorkerStarted", "WorkerExited", "CheckpointDone",
             *(f"node.*.{t}" for t in NODE_REPORT_TYPES))
    config = core.SchedulerConfig(preemption=False, reclaim=False, quotas=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lost_after = float(os.environ.get("CORRAL_NODE_LOST_SECONDS", "10"))
        self.start_timeout = float(os.environ.get("CORRAL_START_TIMEOUT_SECONDS", "120"))
        self.master_addr = os.environ.get("CORRAL_MASTER_ADDR", "127.0.0.1")
        self.heartbeats: dict[str, float] = {}
        self.started_at = self.clock()
        self._place_dirty = True
        self._placed_at = float("-inf")
        #: Gangs an event touched since the last reconcile: only they can have a next step now,
        #: besides the ones time moves on (every gang is looked at every tick).
        self._lifecycle_dirty: set[str] = set()
        self._lifecycles_full_at = float("-inf")

    #: Events after which the placement cycle may decide differently: a job starts or stops
    #: waiting for GPUs, GPUs are freed, nodes come or go. The cycle looks at every waiting job,
    #: so it is skipped while none of these happened (and rerun at least every tick regardless).
    place_triggers = frozenset({
        "QuotaReserved", "QuotaReleased", "JobRequeued", "GangReleased", "JobCancelled", "JobCompleted",
        "JobFailed", "NodeRegistered", "NodeLost", "QueueConfigured", "PreemptRequested",
    })

    #: Events after which a gang may have a next step (see `_lifecycle`).
    lifecycle_triggers = frozenset({
        "GangReserved", "WorkerStarted", "WorkerExited", "JobRunning", "PreemptRequested", "JobCancelled",
        "GangReleased",
    })

    def folded(self, event: Event) -> None:
        if event.type in self.place_triggers:
            self._place_dirty = True
        if event.type in self.lifecycle_triggers:
            job_id = getattr(event, "victim_job_id", None) or getattr(event, "job_id", None)
            if job_id:
                self._lifecycle_dirty.add(job_id)

    # ---- inputs ------------------------------------------------------------------------------
    async def started(self) -> None:
        self.started_at = self.clock()
        ns = self.settings.namespace if self.settings else "corral"

        async def on_heartbeat(msg: Any) -> None:
            node = msg.subject.rsplit(".", 1)[-1]
            self.heartbeats[node] = self.clock()

        await self.bus.nc.subscribe(Subjects(ns).heartbeat_wildcard, cb=on_heartbeat)

    async def handle_inbox_batch(self, items: Sequence[tuple[Event, Delivery]]) -> list[BaseException | None]:
        """The workers' reports of a fetched batch recorded in ONE commit (a commit per report was
        the lifecycle's limit under load: each job sends at least a start and an exit). Node
        registrations, rare, make the batch go one by one, in order, as before."""
        reports = ev.WorkerStarted | ev.WorkerExited | ev.CheckpointDone
        if any(self._report_refused(event, delivery) for event, delivery in items):
            return await super().handle_inbox_batch(items)  # one by one: each refusal on its own
        if len(items) < 2 or not all(isinstance(event, reports) for event, _ in items):
            return await super().handle_inbox_batch(items)
        batches: dict[str, list[Event]] = {}
        trackings: list[Tracking] = []
        for event, delivery in items:
            assert isinstance(event, reports)
            trackings.append(self.tracking(delivery))
            if event.job_id not in self.view.jobs:
                continue  # its tracking row only
            stream = job_stream(event.job_id)
            batches.setdefault(stream, []).append(msgspec.structs.replace(event, stream=stream))
        if await self.append_handled(batches, trackings):
            return [None] * len(items)
        return await super().handle_inbox_batch(items)

    def _report_refused(self, event: Event, delivery: Delivery) -> str | None:
        sender = Subjects(self.bus.namespace).sender_of(delivery.subject, "node")
        return report_refused(event, sender, self.view)

    async def handle_inbox(self, event: Event, delivery: Delivery) -> None:
        tracking = self.tracking(delivery)
        refused = self._report_refused(event, delivery)
        if refused is not None:
            log.warning("report %s %s on %s ignored: %s", event.type, event.event_id, delivery.subject, refused)
            await self.append({}, tracking=tracking)  # its tracking row only: nothing changes
            return
        if isinstance(event, ev.NodeRegistered):
            stream = node_stream(event.node)
            known = self.view.nodes.get(event.node)
            self.heartbeats[event.node] = self.clock()
            if known is not None and not known.lost and _same_inventory(known.inventory, event):
                await self.append({}, tracking=tracking)
                return
            event = msgspec.structs.replace(event, stream=stream)
        elif isinstance(event, ev.WorkerStarted | ev.WorkerExited | ev.CheckpointDone):
            if event.job_id not in self.view.jobs:
                await self.append({}, tracking=tracking)
                return
            event = msgspec.structs.replace(event, stream=job_stream(event.job_id))
        else:
            return
        if not await self.append({event.stream: [event]}, tracking=tracking):
            raise Retry("stream moved on; recording the report again", delay=0.02)

    # ---- decisions ---------------------------------------------------------------------------
    async def reconcile(self) -> None:
        now = self.clock()
        await self._nodes(now)
        await self._lifecycles(now)
        await self._place(now)

    async def _lifecycles(self, now: float) -> None:
        """Every gang's next step, appended in one transaction (a commit per event was the log's
        limit under load). Each job's events are guarded by the versions they were decided on: if
        the whole batch loses a race (an inbox report landed meanwhile), each job is appended on
        its own with those versions, so only the job that moved waits for the next reconcile."""
        if time.monotonic() - self._lifecycles_full_at >= self.tick_seconds:
            # Everything now and then: some steps are due to time alone (start barrier, cancels).
            self._lifecycles_full_at = time.monotonic()
            jobs = self.view.running_jobs()
        else:
            jobs = [j for j in (self.view.jobs.get(i) for i in self._lifecycle_dirty) if j is not None and j.holding]
        self._lifecycle_dirty = set()
        decided: list[dict[str, list[Event]]] = []
        for job in sorted(jobs, key=lambda j: j.job_id):
            steps = self._lifecycle(job, now)
            if steps:
                decided.append(steps)
        if not decided:
            return
        merged: dict[str, list[Event]] = {}
        for steps in decided:
            for stream, events in steps.items():
                merged.setdefault(stream, []).extend(events)
        expected = {stream: self.view.versions.get(stream, 0) for stream in merged}
        if await self.append(merged, expected=expected):
            return
        self._lifecycles_full_at = float("-inf")  # look at every gang again next time
        if len(decided) == 1:
            return
        for steps in decided:
            await self.append(steps, expected={stream: expected[stream] for stream in steps})

    async def _nodes(self, now: float) -> None:
        for node in sorted(self.view.nodes.values(), key=lambda n: n.name):
            if node.lost:
                continue
            last = self.heartbeats.get(node.name, self.started_at)
            if now - last <= self.lost_after:
                continue
            log.warning("node %s lost: no heartbeat for %.1fs", node.name, now - last)
            lost = ev.NodeLost.new(stream=node_stream(node.name), actor="placement", correlation_id=node.name,
                                   node=node.name, reason=Reason(
                                       code="HEARTBEAT_MISSED",
                                       message=f"no heartbeat from {node.name} for {now - last:.0f}s "
                                               f"(limit {self.lost_after:.0f}s)",
                                       details={"seconds": round(now - last, 1)}))
            if not await self.append({lost.stream: [lost]}):
                continue
            for job in sorted(self.view.running_jobs(), key=lambda j: j.job_id):
                if node.name in job.nodes:
                    await self._release(job, "NODE_LOST", f"node {node.name} was lost", requeue=True)

    def _lifecycle(self, job: JobView, now: float) -> dict[str, list[Event]]:
        """The events that move this gang on (none if it stays as it is), by stream."""
        ranks = {r.rank for r in job.ranks}
        exits = job.exited_ranks
        if job.state is JobState.CANCELLED:
            if not (job.started_ranks - set(exits)) or _age(job.ended_at, now) > 60:
                return self._release_events(job, "CANCELLED", "the job was cancelled")
            return {}
        running: list[Event] = []
        if job.state is JobState.STARTING:
            if ranks <= job.started_ranks:
                running.append(ev.JobRunning.new(stream=job_stream(job.job_id), actor="placement",
                                                 correlation_id=job.job_id, job_id=job.job_id,
                                                 attempt=job.attempt))
            elif _age(job.placed_at, now) > self.start_timeout:
                missing = sorted(ranks - job.started_ranks)
                return self._release_events(job, "START_TIMEOUT", f"ranks {missing} did not start within "
                                            f"{self.start_timeout:.0f}s; the whole gang is released", requeue=True)
        released: dict[str, list[Event]] = {}
        crashed = {r: c for r, c in exits.items() if c not in (0, CHECKPOINTED_EXIT)}
        if not exits:
            pass
        elif job.state is JobState.PREEMPTING:
            if ranks <= set(exits):
                released = self._release_events(job, "PREEMPTED", f"checkpointed and stopped for {_preemptor(job)}")
        elif crashed:
            # The rank that crashed first has an exit code; its peers were killed (no code).
            rank, code = min(crashed.items(), key=lambda rc: (rc[1] is None, rc[0]))
            restart = job.spec is not None and job.restarts < job.spec.restart.max_restarts
            what = f"exited with {code}" if code is not None else "was killed"
            released = self._release_events(job, "WORKER_FAILED", f"rank {rank} {what}", requeue=restart,
                                            fail=not restart, requeue_code="RESTARTING")
        elif ranks <= set(exits):
            if all(c == 0 for c in exits.values()):
                released = self._release_events(job, "COMPLETED", "every rank exited 0", complete=True,
                                                running_recorded=bool(running))
            else:
                released = self._release_events(job, "CHECKPOINTED", "every rank stopped after a checkpoint",
                                                requeue=True)
        if running:
            stream = job_stream(job.job_id)
            released[stream] = running + released.get(stream, [])
        return released

    async def _release(self, job: JobView, code: str, message: str, *, requeue: bool = False,
                       fail: bool = False, complete: bool = False, requeue_code: str | None = None) -> bool:
        return await self.append(self._release_events(job, code, message, requeue=requeue, fail=fail,
                                                      complete=complete, requeue_code=requeue_code))

    def _release_events(self, job: JobView, code: str, message: str, *, requeue: bool = False,
                        fail: bool = False, complete: bool = False, requeue_code: str | None = None,
                        running_recorded: bool = False) -> dict[str, list[Event]]:
        """GangReleased (and how the job goes on) on its stream, a GpusReleased on each node's.
        `running_recorded`: a JobRunning is already among this reconcile's events for the job."""
        stream = job_stream(job.job_id)
        common: dict[str, Any] = {"stream": stream, "actor": "placement", "correlation_id": job.job_id,
                                  "job_id": job.job_id}
        reason = Reason(code=code, message=message, details={"attempt": job.attempt})
        job_events: list[Event] = []
        if complete and job.state is JobState.STARTING and not running_recorded:
            job_events.append(ev.JobRunning.new(attempt=job.attempt, **common))
        released = ev.GangReleased.new(reason=reason, attempt=job.attempt, **common)
        job_events.append(released)
        if complete:
            job_events.append(ev.JobCompleted.new(attempt=job.attempt, causation=released,
                                                  **common))
        if fail:
            job_events.append(ev.JobFailed.new(
                reason=Reason(code=code, message=f"{message}; no restarts left "
                              f"({job.restarts} of {job.spec.restart.max_restarts if job.spec else 0} used)"),
                attempt=job.attempt, causation=released, **common))
        if requeue:
            job_events.append(ev.JobRequeued.new(
                reason=Reason(code=requeue_code or code, message=message), attempt=job.attempt + 1,
                resume_from=job.checkpoint, causation=released, **common))
        batches: dict[str, list[Event]] = {stream: job_events}
        for node, gpus in job.core_placement().gpus_by_node().items():
            batches[node_stream(node)] = [ev.GpusReleased.new(
                stream=node_stream(node), actor="placement", correlation_id=job.job_id, causation=released,
                node=node, job_id=job.job_id, gpus=list(gpus), attempt=job.attempt)]
        return batches

    async def _place(self, now: float) -> None:
        if not self._place_dirty and time.monotonic() - self._placed_at < self.tick_seconds:
            return
        self._place_dirty, self._placed_at = False, time.monotonic()
        waiting = [j for j in self.view.active.values()
                   if j.state is JobState.PENDING and j.quota_gpus and not j.quota_stale and j.spec is not None]
        if not waiting or not self.view.nodes:
            return
        snapshot = self.view.snapshot(now, pending=waiting)
        # One append for every gang of this cycle (decided together on one snapshot, so they never
        # overlap), and one for the reasons: a commit per event was the log's limit under load.
        gangs: dict[str, list[Event]] = {}
        reasons: dict[str, list[Event]] = {}
        for decision in core.schedule(snapshot, self.config):
            job = self.view.jobs[decision.job_id]
            if isinstance(decision, core.Place):
                for stream, events in self._reserve(job, decision).items():
                    gangs.setdefault(stream, []).extend(events)
            elif isinstance(decision, core.Pending) and self.reason_news(job, str(decision.reason.code),
                                                                         decision.reason.message):
                pending = ev.PlacementPending.new(stream=job_stream(job.job_id), actor="placement",
                                                  correlation_id=job.job_id, job_id=job.job_id,
                                                  reason=wire_reason(decision.reason))
                reasons[pending.stream] = [pending]
        if gangs:
            try:
                if not await self.append(gangs):
                    self._place_dirty = True  # lost a race: decide again on the fresh state
            except asyncpg.UniqueViolationError as exc:
                self._place_dirty = True
                # The last line of defence fired: our view was wrong. Nothing was written; re-read.
                log.error("allocations refused by the database (a GPU is held already): %s", exc)
                for stream in gangs:
                    await self.refresh_stream(stream)
        await self.append(reasons)

    def _reserve(self, job: JobView, decision: core.Place) -> dict[str, list[Event]]:
        """GangReserved on the job's stream and a GpusAllocated on each node stream it touches."""
        stream = job_stream(job.job_id)
        port = 29500 + zlib.crc32(f"{job.job_id}:{job.attempt}".encode()) % 20000
        gang = ev.GangReserved.new(
            stream=stream, actor="placement", correlation_id=job.job_id, job_id=job.job_id,
            ranks=[ev.RankPlacement(rank=r.rank, node=r.node, gpus=list(r.gpus)) for r in decision.placement.ranks],
            world_size=len(decision.placement.ranks), master_addr=self.master_addr, master_port=port,
            attempt=job.attempt, resume_from=job.resume_from)
        batches: dict[str, list[Event]] = {stream: [gang]}
        for node, gpus in decision.placement.gpus_by_node().items():
            batches[node_stream(node)] = [ev.GpusAllocated.new(
                stream=node_stream(node), actor="placement", correlation_id=job.job_id, causation=gang,
                node=node, job_id=job.job_id, gpus=list(gpus), attempt=job.attempt)]
        return batches


def _same_inventory(inventory: Any, event: ev.NodeRegistered) -> bool:
    return bool(inventory.gpus == event.gpus and inventory.nvlink_domains == event.nvlink_domains
                and inventory.rack == event.rack and inventory.zone == event.zone)


def _age(at: Any, now: float) -> float:
    return now - at.timestamp() if at is not None else 0.0


def _preemptor(job: JobView) -> str:
    return f"job {job.preempt.for_job_id}" if job.preempt is not None else "another job"


__all__ = ["Placement"]
