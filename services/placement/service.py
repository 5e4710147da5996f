"""Placement: the only writer of GPU allocations, and the keeper of node and gang lifecycles.

Exactly one instance is active: it holds the `placement` lease (a Postgres advisory lock); a
standby blocks on it and takes over, rebuilding from the log, when the holder dies.

Each reconcile:
1. nodes: a node whose heartbeats stopped for `lost_after` seconds is lost (NodeLost);
2. gangs: `corral.lifecycle.next_steps` decides each gang's next steps (JobRunning; GangReleased
   and how the job goes on: completed, failed, requeued from its checkpoint; GpusReleased per
   node once that node's ranks are gone — the fence) from the log and from the heartbeats'
   `running_job_ids` (a running gang a live node no longer runs is released: WORKERS_LOST);
   this module only turns those values into events;
3. placement: the core's placement step (`corral.core.steps.placement_step`) over jobs holding
   quota → GangReserved, written together
   with a GpusAllocated per node (node streams at their expected versions; the allocations
   table's unique index refuses a GPU held twice), or PlacementPending when the reason changes.

Node agents have no database: placement records their reports (NodeRegistered, WorkerStarted,
WorkerExited, CheckpointDone) from the inbox, each exactly once (tracking rows).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg
import msgspec

from corral import core, lifecycle
from corral.bus import Delivery, Retry
from corral.contracts import events as ev
from corral.contracts.envelope import Event, Reason, job_stream, node_stream
from corral.contracts.flow import PLACEMENT, names
from corral.contracts.problems import ContractError
from corral.contracts.registry import decode
from corral.contracts.routes import consumed_by, inbox_of
from corral.contracts.subjects import Subjects
from corral.core.joiners import head_of, joiners_step
from corral.core.steps import placement_step
from corral.eventstore import Tracking
from corral.projection import Fence, JobView, NodeView, QuotaPhase
from corral.services.base import Service
from corral.services.placement.first_reason import FirstReasonGrace
from corral.services.placement.rendezvous import choose_rendezvous
from corral.services.placement.report_auth import request_refused
from corral.services.senders import as_sent_by, sender_of
from corral.services.settings import PlacementSettings

log = logging.getLogger("corral.placement")

#: A node's reports about a job's ranks, recorded on the job's stream.
REPORTS = ev.WorkerStarted | ev.WorkerExited | ev.CheckpointDone


class Placement(Service):
    name = "placement"
    lease = "placement"
    #: `node.*.<Report>`: reports on a subject naming the node that sent them (a node identity may
    #: publish only its own, see `corral.bus.auth`); the bare subjects only a superuser may publish.
    inbox = inbox_of(PLACEMENT)
    #: Placement is not sent back what it alone writes (each event's `flow`): it folds each of its
    #: events when it appends it, so the bus's copy would be a duplicate delivered, decoded and
    #: acknowledged for nothing, on the one process that places every job. The log stays the
    #: truth: a new leader folds the log before it decides, and an event it was not sent (one a
    #: deposed leader appended after that) is behind a stream version its next decision on that
    #: stream (the job's, or the node's for an allocation) is guarded by: that append loses the
    #: race, the stream is re-read (GpusAllocated is folded for this), and it decides again.
    consumes = names(consumed_by(PLACEMENT))
    #: What a reconcile follows: all it is sent but what it only folds, a job's submission and
    #: admission (a job is placed once it holds quota: QuotaReserved) and the reasons and
    #: escalations of waiting jobs. A reconcile after one of these decides nothing, and the job's
    #: QuotaReserved, a few milliseconds behind, would wait out `reconcile_interval` after it.
    events = frozenset(consumed_by(PLACEMENT)) - {ev.JobSubmitted, ev.JobAdmitted, ev.JobRejected,
                                                  ev.PlacementPending, ev.WaitExceeded}
    #: A late report of an ended job (a rank's exit after its job was decided) is checked and
    #: recorded against the job as its stream in the log says (`forgotten_job`).
    forgets_ended_jobs = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The environment is read once, by the settings (a test without any reads it here).
        own = self.settings.placement if self.settings is not None else PlacementSettings.from_env()
        self.lost_after = own.node_lost_seconds
        self.limits = own.limits
        #: which jobs each node's heartbeats list (the agents' word on what runs where)
        self.beats = lifecycle.Heartbeats()
        #: MASTER_ADDR of a gang whose rank 0's node advertised no address (simulated nodes, agents that do not say)
        self.master_addr = own.master_addr
        self.heartbeats: dict[str, float] = {}
        self.started_at = self.clock()
        self._place_dirty = True
        self._placed_at = float("-inf")
        #: Gangs an event touched since the last reconcile: only they can have a next step now,
        #: besides the ones time moves on (every gang is looked at every tick).
        self._lifecycle_dirty: set[str] = set()
        self._lifecycles_full_at = float("-inf")
        #: The jobs placement places: waiting and holding quota (`_places`), kept by the view as
        #: events are folded (`ClusterView.jobs_where`). Listing them from every active job on
        #: every cycle was a tenth of placement's loop with thousands waiting for quota.
        self._waiting = self.view.jobs_where(_places)
        #: the core's job classes, kept between cycles (the view keeps its PendingJob objects)
        self.classes = core.ClassMemo()
        #: After a full cycle on a full cluster: its first job and the cluster, queues and running
        #: jobs it was decided on (`_joiners`); None when the next cycle must be a full one.
        self._held: tuple[core.PendingJob, core.Snapshot] | None = None
        #: Jobs an event touched since the last cycle: the ones a cycle over joiners decides.
        self._touched: set[str] = set()
        self._joiner_classes = core.ClassMemo()
        #: a job's first reason waits for its grace (`first_reason`); the timer that wakes for it,
        #: `grace_batch_seconds` late so that one wake says the reasons of every job due meanwhile
        self._grace = FirstReasonGrace(self.monotonic, own.first_reason_grace_seconds)
        self._grace_timer: asyncio.TimerHandle | None = None
        self._refolded_at = float("-inf")

    #: Events after which the placement cycle may decide differently: a job starts or stops
    #: waiting for GPUs, GPUs are freed (GpusReleased: a node's fence opened), nodes come or go.
    #: The cycle looks at every waiting job, so it is skipped while none of these happened (and
    #: rerun at least every tick regardless).
    place_triggers: frozenset[type[Event]] = frozenset({
        ev.QuotaReserved, ev.QuotaReleased, ev.JobRequeued, ev.GangReleased, ev.GpusReleased, ev.JobCancelled,
        ev.JobCompleted, ev.JobFailed, ev.NodeRegistered, ev.NodeLost, ev.QueueConfigured, ev.PreemptRequested,
        ev.NodeDrained, ev.NodeUndrained, ev.NodeConditionsChanged, ev.GpuHealthChanged, ev.GpuDrained,
        ev.GpuUndrained,
    })

    #: Events after which a gang may have a next step (see `_lifecycles`). Not GangReserved nor
    #: JobRunning: a gang just reserved moves on after a start, a cancellation or a preemption
    #: request (events here) or with time (the tick's pass over every gang), and `next_steps`
    #: decides a gang's release in the pass that marks it running, so neither would find a step.
    lifecycle_triggers: frozenset[type[Event]] = frozenset({
        ev.WorkerStarted, ev.WorkerExited, ev.PreemptRequested, ev.JobCancelled, ev.GangReleased,
    })

    grace_batch_seconds: float = 0.05
    #: A view found broken again this soon after the log was folded again is not refolded (`_refold`).
    refold_seconds: float = 60.0
    #: A waiting job's reason with only its numbers changed is said again at most this often: every
    #: placement changes the numbers of GANG_DOES_NOT_FIT ("needs 8 GPUs on one node, at most 6
    #: free"), and a backlog's reasons said each time take the log's capacity. A new code is news at
    #: once (`corral.services.reason_throttle`); `corral why` works out what would unblock the job
    #: from the cluster of now.
    reason_refresh_seconds = 30.0
    #: Events after which a job no longer waits for placement (its first-reason grace is over).
    _not_waiting = (ev.GangReserved, ev.QuotaReleased, ev.JobCancelled, ev.JobCompleted, ev.JobFailed)

    def folded(self, event: Event) -> None:
        if isinstance(event, ev.QuotaReserved):
            self._grace.reserved(event.job_id)
        elif isinstance(event, self._not_waiting):
            self._grace.forget(event.job_id)
        if type(event) in self.place_triggers:
            self._place_dirty = True
        if not isinstance(event, ev.PlacementPending):
            job_id = getattr(event, "job_id", None)
            if job_id:
                self._touched.add(job_id)
        if isinstance(event, ev.GpuHealthChanged):
            self._lifecycles_full_at = float("-inf")  # the gangs on a GPU gone bad are released now
        if type(event) in self.lifecycle_triggers:
            job_id = getattr(event, "victim_job_id", None) or getattr(event, "job_id", None)
            if job_id:
                self._lifecycle_dirty.add(job_id)

    # ---- inputs ------------------------------------------------------------------------------
    async def started(self) -> None:
        self.started_at = self.clock()
        ns = self.settings.namespace if self.settings else "corral"

        async def on_heartbeat(msg: Any) -> None:
            node = msg.subject.rsplit(".", 1)[-1]
            now = self.clock()
            self.heartbeats[node] = now
            try:
                beat = decode(msg.data)
            except ContractError as exc:
                log.warning("heartbeat on %s is not a NodeHeartbeat (%s); counted as a sign of life only",
                            msg.subject, exc)
                return
            if isinstance(beat, ev.NodeHeartbeat) and beat.node == node:
                self.beats.record(node, now, beat.running_job_ids, beat.handled_position)

        await self.bus.nc.subscribe(Subjects(ns).heartbeat_wildcard, cb=on_heartbeat)

    async def handle_inbox_batch(self, items: Sequence[tuple[Event, Delivery]]) -> list[BaseException | None]:
        """The workers' reports of a fetched batch recorded in ONE commit (a commit per report was
        the lifecycle's limit under load: each job sends at least a start and an exit). Node
        registrations, rare, make the batch go one by one, in order, as before."""
        if any(self._report_refused(event, delivery) for event, delivery in items) or any(
                getattr(event, "job_id", None) in self.view.forgotten for event, _ in items):
            return await super().handle_inbox_batch(items)  # one by one: a refusal, an ended job's report
        if len(items) < 2 or not all(isinstance(event, REPORTS) for event, _ in items):
            return await super().handle_inbox_batch(items)
        batches: dict[str, list[Event]] = {}
        trackings: list[Tracking] = []
        for event, delivery in items:
            assert isinstance(event, REPORTS)
            trackings.append(self.tracking(delivery))
            if event.job_id not in self.view.jobs:
                continue  # its tracking row only
            batches.setdefault(job_stream(event.job_id), []).append(
                self._report_as_recorded(event, self.view.jobs[event.job_id]))
        if await self.append_handled(batches, trackings):
            return [None] * len(items)
        return await super().handle_inbox_batch(items)

    def _report_as_recorded(self, report: ev.WorkerStarted | ev.WorkerExited | ev.CheckpointDone,
                            job: JobView) -> Event:
        """A worker's report on its job's stream, its time kept within what can be true.

        A report's time feeds the job's running time (attained service, which orders LAS) and
        its last checkpoint (the work a preemption would lose, which orders victims), and the
        node's clock may be minutes off: a checkpoint dated ahead would make a job look cheap to
        stop, one dated before its run expensive. The agent's time is kept (it is when the rank
        started or saved), but never later than now, nor before this attempt was placed (a
        checkpoint: before it ran)."""
        now = datetime.fromtimestamp(self.clock(), UTC)
        floor = job.submitted_at
        if report.attempt == job.attempt:
            floor = job.placed_at or floor
            if isinstance(report, ev.CheckpointDone) and job.running_since is not None:
                floor = job.running_since
        at = min(report.occurred_at, now)
        if floor is not None and at < floor:
            at = min(floor, now)
        return msgspec.structs.replace(report, stream=job_stream(report.job_id), occurred_at=at)

    def _report_refused(self, event: Event, delivery: Delivery, ended: JobView | None = None) -> str | None:
        return request_refused(event, Subjects(self.bus.namespace).principal_of(delivery.subject), self.view, ended)

    async def handle_inbox(self, event: Event, delivery: Delivery) -> None:
        tracking = self.tracking(delivery)
        # A report of a job the fold forgot (it ended, holding nothing): the job as the log says.
        ended = await self.forgotten_job(event.job_id) if isinstance(event, REPORTS) else None
        refused = self._report_refused(event, delivery, ended)
        if refused is not None:
            log.warning("report %s %s on %s ignored: %s", event.type, event.event_id, delivery.subject, refused)
            await self.append({}, tracking=tracking)  # its tracking row only: nothing changes
            return
        if isinstance(event, ev.NodeRegistered):
            stream = node_stream(event.node)
            known = self.view.nodes.get(event.node)
            self.heartbeats[event.node] = self.clock()
            if known is not None and not known.lost and _same_inventory(known, event):
                await self.append({}, tracking=tracking)
                return
            event = msgspec.structs.replace(event, stream=stream)
        elif isinstance(event, REPORTS):
            job = self.view.jobs.get(event.job_id) or ended
            if job is None:
                await self.append({}, tracking=tracking)
                return
            event = self._report_as_recorded(event, job)
        elif isinstance(event, ev.NodeConditionsChanged):
            node = self.view.nodes.get(event.node)
            if node is None or tuple(event.conditions) == node.conditions:
                await self.append({}, tracking=tracking)  # an unknown node, or nothing new
                return
            for c in event.conditions:
                log.warning("node %s: %s: %s; no new work there until it clears", event.node, c.type, c.message)
            if not event.conditions:
                log.info("node %s: its conditions cleared; it takes work again", event.node)
            event = msgspec.structs.replace(event, stream=node_stream(event.node))
        elif isinstance(event, ev.GpuHealthChanged):
            node = self.view.nodes.get(event.node)
            if node is None or {p.gpu: p for p in event.unhealthy} == node.unhealthy:
                await self.append({}, tracking=tracking)  # an unknown node, or nothing new
                return
            for p in event.unhealthy:
                log.warning("node %s GPU %d unhealthy: %s: %s; no new work on it", event.node, p.gpu, p.code,
                            p.message)
            healed = sorted(set(node.unhealthy) - {p.gpu for p in event.unhealthy})
            if healed:
                log.info("node %s GPUs %s healthy again", event.node, healed)
            event = msgspec.structs.replace(event, stream=node_stream(event.node))
        elif isinstance(event, ev.GpuDrained | ev.GpuUndrained):
            event = as_sent_by(event, sender_of(Subjects(self.bus.namespace), delivery.subject))
            assert isinstance(event, ev.GpuDrained | ev.GpuUndrained)
            node = self.view.nodes.get(event.node)
            if node is None or event.gpu >= node.gpu_count or \
                    isinstance(event, ev.GpuDrained) == (event.gpu in node.drained_gpus):
                log.info("%s of %s:%d changes nothing (%s)", event.type, event.node, event.gpu,
                         "no such GPU" if node is None or event.gpu >= node.gpu_count else "already so")
                await self.append({}, tracking=tracking)
                return
            event = msgspec.structs.replace(event, stream=node_stream(event.node))
        elif isinstance(event, ev.NodeDrained | ev.NodeUndrained):
            event = as_sent_by(event, sender_of(Subjects(self.bus.namespace), delivery.subject))
            assert isinstance(event, ev.NodeDrained | ev.NodeUndrained)
            node = self.view.nodes.get(event.node)
            if node is None or _drain_changes_nothing(node, event):
                log.info("%s of node %s changes nothing (%s)", event.type, event.node,
                         "no such node" if node is None else "already so")
                await self.append({}, tracking=tracking)
                return
            event = msgspec.structs.replace(event, stream=node_stream(event.node))
        else:
            return
        if not await self.append({event.stream: [event]}, tracking=tracking):
            raise Retry("stream moved on; recording the report again", delay=0.02)

    # ---- decisions ---------------------------------------------------------------------------
    async def reconcile(self) -> None:
        now = self.clock()
        await self._nodes(now)
        await self._release_positions()
        await self._lifecycles(now)
        await self._place(now)

    async def _lifecycles(self, now: float) -> None:
        """Every gang's next steps, appended in one transaction (a commit per event was the log's
        limit under load). Each job's events are guarded by the versions they were decided on: if
        the whole batch loses a race (an inbox report landed meanwhile), each job is appended on
        its own with those versions, so only the job that moved waits for the next reconcile."""
        if self.monotonic() - self._lifecycles_full_at >= self.tick_seconds:
            # Everything now and then: some steps are due to time alone (start barrier, fences,
            # heartbeats that stopped listing a gang).
            self._lifecycles_full_at = self.monotonic()
            jobs = self.view.running_jobs() + self.view.fenced_jobs()
        else:
            jobs = [j for j in (self.view.jobs.get(i) for i in self._lifecycle_dirty)
                    if j is not None and (j.holding or j.fences)]
        self._lifecycle_dirty = set()
        decided: list[dict[str, list[Event]]] = []
        for job in sorted({j.job_id: j for j in jobs}.values(), key=lambda j: j.job_id):
            steps = self._steps(job, now)
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

    async def _release_positions(self) -> None:
        """The log position of each fence's GangReleased (a fence is confirmed from heartbeats only
        once the node's agent has handled up to it: `lifecycle._handled_release`)."""
        missing = {fence.released_by: fence for job in self.view.fenced_jobs() for fence in job.fences.values()
                   if fence.released_position is None and fence.released_by}
        if not missing:
            return
        for event_id, position in (await self.store.positions_of(sorted(missing))).items():
            missing[event_id].released_position = position

    async def _nodes(self, now: float) -> None:
        for node in sorted(self.view.nodes.values(), key=lambda n: n.name):
            if node.lost:
                continue
            last = self.heartbeats.get(node.name, self.started_at)
            if now - last <= self.lost_after:
                continue
            log.warning("node %s lost: no heartbeat for %.1fs", node.name, now - last)
            lost = self.new_event(ev.NodeLost, stream=node_stream(node.name), node=node.name, reason=Reason(
                                       code="HEARTBEAT_MISSED",
                                       message=f"no heartbeat from {node.name} for {now - last:.0f}s "
                                               f"(limit {self.lost_after:.0f}s)",
                                       details={"seconds": round(now - last, 1)}))
            if await self.append({lost.stream: [lost]}):
                # its gangs are released (NODE_LOST) and its fences closed by the lifecycle, now
                self._lifecycles_full_at = float("-inf")

    # ---- the gang lifecycle (corral.lifecycle decides; this turns its steps into events) -------
    def _steps(self, job: JobView, now: float) -> dict[str, list[Event]]:
        """The events that move this job's gangs on (none if they stay as they are), by stream."""
        batches: dict[str, list[Event]] = {}
        current = self._gang(job)
        gangs = [current] if current is not None else []
        gangs += [self._fenced_gang(job, fence) for _, fence in sorted(job.fences.items())]
        for gang in gangs:
            released: ev.GangReleased | None = None
            for step in lifecycle.next_steps(gang, now, self.limits):
                event: Event
                if isinstance(step, lifecycle.MarkRunning):
                    event = self.new_event(ev.JobRunning, job_id=job.job_id, attempt=gang.attempt)
                elif isinstance(step, lifecycle.Release):
                    released = self.new_event(
                        ev.GangReleased, job_id=job.job_id, attempt=gang.attempt,
                        reason=Reason(code=step.code.value, message=step.message, details={"attempt": gang.attempt}))
                    batches.setdefault(released.stream, []).append(released)
                    log.info("job %s attempt %d released: %s %s", job.job_id, gang.attempt, step.code.value,
                             step.message)
                    then = self._then(job, gang, step, released)
                    if then is None:
                        continue
                    event = then
                else:
                    event = self.new_event(
                        ev.GpusReleased, stream=node_stream(step.node), correlation_id=job.job_id,
                        causation=released, node=step.node, job_id=job.job_id, gpus=list(step.gpus),
                        attempt=gang.attempt)
                batches.setdefault(event.stream, []).append(event)
        return batches

    def _then(self, job: JobView, gang: lifecycle.Gang, step: lifecycle.Release,
              released: ev.GangReleased) -> Event | None:
        """How the job goes on after its gang's release."""
        common: dict[str, Any] = {"job_id": job.job_id, "causation": released, "correlation_id": job.job_id}
        if step.then is lifecycle.Then.COMPLETE:
            return self.new_event(ev.JobCompleted, attempt=gang.attempt, **common)
        if step.then is lifecycle.Then.FAIL:
            return self.new_event(ev.JobFailed, attempt=gang.attempt, **common, reason=Reason(
                code=step.code.value, message=step.fail_message or step.message))
        if step.then is lifecycle.Then.REQUEUE:
            code = step.requeue_code or step.code
            return self.new_event(
                ev.JobRequeued, attempt=gang.attempt + 1, resume_from=job.checkpoint, **common,
                reason=Reason(code=code.value, message=step.message, details={"attempt": gang.attempt + 1}))
        return None

    def _gang(self, job: JobView) -> lifecycle.Gang | None:
        """The job's current attempt as a `lifecycle.Gang`, while it holds its GPUs."""
        if not job.holding or job.gang is None:
            return None
        placement = job.core_placement()
        return lifecycle.Gang(
            job_id=job.job_id, attempt=job.attempt, state=job.gang, placement=placement,
            placed_at=_at(job.placed_at), started=frozenset(job.started_ranks), exits=dict(job.exited_ranks),
            exit_reasons={r: (why.code, why.message) for r, why in job.exit_reasons.items()},
            running_since=job.running_since.timestamp() if job.running_since else None,
            restarts=job.restarts, max_restarts=job.spec.restart.max_restarts if job.spec else 0,
            preemptor=job.preempt.for_job_id if job.preempt else None,
            preempt_deadline=job.preempt.deadline.timestamp() if job.preempt else None,
            lost_nodes=self._lost(placement), unhealthy_gpus=self._unhealthy(placement),
            seen=self.beats.about(placement.nodes(), job.job_id), reports_read_at=self.inbox_read_at,
            time_limit=job.spec.time_limit if job.spec else None)

    def _fenced_gang(self, job: JobView, fence: Fence) -> lifecycle.Gang:
        """A released attempt of the job whose GPUs are still held, as a `lifecycle.Gang`."""
        placement = fence.core_placement()
        return lifecycle.Gang(
            job_id=job.job_id, attempt=fence.attempt, state=lifecycle.GangState.RELEASING, placement=placement,
            placed_at=_at(fence.placed_at), started=frozenset(fence.started), exits=dict(fence.exits),
            released_at=fence.released_at.timestamp(), freed=frozenset(placement.nodes()) - set(fence.open),
            lost_nodes=self._lost(placement), seen=self.beats.about(placement.nodes(), job.job_id),
            released_position=fence.released_position)

    def _unhealthy(self, placement: core.Placement) -> dict[tuple[str, int], str]:
        """The placement's GPUs that their agents find unhealthy now, with why."""
        out: dict[tuple[str, int], str] = {}
        for node in placement.nodes():
            view = self.view.nodes.get(node)
            if view is not None and view.unhealthy:
                out.update(((node, gpu), p.message) for gpu, p in view.unhealthy.items())
        return out

    def _lost(self, placement: core.Placement) -> frozenset[str]:
        return frozenset(n for n in placement.nodes() if (v := self.view.nodes.get(n)) is not None and v.lost)

    async def _place(self, now: float) -> None:
        await self._cycle(now)
        self._wake_for_grace()

    async def _cycle(self, now: float) -> None:
        # Between ticks the cycle runs after a trigger only if it could place a job: with no GPU
        # free every answer is a reason, and the tick's cycle gives each job its reason. The
        # cycle looks at every waiting job, and a new waiting job (or a waiting job cancelled)
        # on a full cluster changes no placement: a cycle for each would keep a core busy behind
        # every `corral submit` and `cancel` with a deep backlog. On a full cluster where only
        # waiting jobs came and went, the tick decides the new ones alone (`_joiners`).
        # A job whose first reason was held back for its grace (`first_reason`) is decided again
        # once the grace is over, with or without an event meanwhile.
        due = self._grace_due()
        if self.monotonic() - self._placed_at < self.tick_seconds \
                and (not self._place_dirty or self.view.free_gpus() == 0) and not due:
            return
        self._touched |= due
        if self._held is not None and self._held[0].job.id in due:
            self._held = None  # the first job's answer is not recorded either: a full cycle decides it
        self._place_dirty, self._placed_at = False, self.monotonic()
        if not self._waiting or not self.view.nodes:
            return
        broken = sorted(i for i, j in self._waiting.items() if j.holding)
        if broken:
            await self._refold(broken)
            return
        if await self._joiners(now):
            return
        self._held, self._touched = None, set()
        waiting = list(self._waiting.values())  # the snapshot orders them
        snapshot = self.view.snapshot(now, pending=waiting, releasing=True, config=self.config)
        # One append for every gang and reason of this cycle (decided together on one snapshot, so
        # they never overlap): a commit per event was the log's limit under load.
        gangs: dict[str, list[Event]] = {}
        reasons: dict[str, list[Event]] = {}
        taken: dict[str, set[int]] = {}  # rendezvous ports given out in this cycle, by address
        decisions = placement_step(snapshot, self.config, memo=self.classes)
        for decision in decisions:
            job = self.view.jobs[decision.job_id]
            reason: core.Reason | None = None
            if isinstance(decision, core.Place):
                reserved = self._reserve(job, decision, taken)
                if isinstance(reserved, core.Reason):
                    reason = reserved
                else:
                    for stream, events in reserved.items():
                        gangs.setdefault(stream, []).extend(events)
            elif isinstance(decision, core.Pending):
                reason = decision.reason
            pending = self._reason_event(job, reason) if reason is not None else None
            if pending is not None:
                reasons[pending.stream] = [pending]
        if gangs:
            # One commit for the cycle's gangs and reasons (group commit); the reasons alone after
            # the gangs lost (a job's stream holds its gang or its reason, never both).
            merged = {stream: [*events] for stream, events in gangs.items()}  # in the gangs' order, then
            for stream, events in reasons.items():
                merged.setdefault(stream, []).extend(events)
            try:
                if await self.append(merged):
                    return
                self._place_dirty = True  # lost a race: decide again on the fresh state
            except asyncpg.UniqueViolationError as exc:
                self._place_dirty = True
                # The last line of defence fired: our view was wrong, and maybe not only on these
                # streams (a fold that skipped events re-reads nothing from its versions). Nothing
                # was written; the log is folded again (only the streams, if it was just now).
                log.error("allocations refused by the database (a GPU is held already): %s", exc)
                if self.monotonic() - self._refolded_at >= self.refold_seconds:
                    self._refolded_at = self.monotonic()
                    await self.cold_fold()
                    return
                for stream in merged:
                    await self.refresh_stream(stream)
        if await self.append(reasons) and not gangs:
            head = head_of(snapshot, decisions)
            self._held = None if head is None else (head, core.Snapshot(now, snapshot.cluster, snapshot.queues, (),
                                                                        snapshot.running))

    async def _refold(self, broken: list[str]) -> None:
        """Jobs both waiting and holding GPUs: this view is not what the log says (a fold of the log
        never holds both), and the core refuses such a snapshot. The log is folded again rather
        than decided on or died of; a second time within `refold_seconds`, the log itself is
        taken for broken and the error raised (the process ends, a standby takes over)."""
        if self.monotonic() - self._refolded_at < self.refold_seconds:
            raise RuntimeError(f"placement: jobs {broken[:10]} both waiting and holding GPUs again after "
                               "folding the log again")
        log.error("placement: jobs %s are both waiting and holding GPUs in this view, which the log "
                  "never says; folding the log again", broken[:10])
        self._refolded_at = self.monotonic()
        await self.cold_fold()

    def refolded(self) -> None:
        self._waiting = self.view.jobs_where(_places)
        self._held, self._touched, self._lifecycle_dirty = None, set(), set()
        self.classes, self._joiner_classes = core.ClassMemo(), core.ClassMemo()
        self._place_dirty, self._lifecycles_full_at = True, float("-inf")

    def _reason_event(self, job: JobView, reason: core.Reason) -> ev.PlacementPending | None:
        """The PlacementPending for why `job` is not placed, or None: not news (`pending_event`), or
        the job's first reason since quota reserved it, within its grace (`first_reason`)."""
        if job.reason is None and not self._grace.may_say(job.job_id):
            return None
        return self.pending_event(job, reason)

    def _grace_due(self) -> set[str]:
        """The waiting jobs whose first reason was held back and whose grace is over (a timer wakes
        the service for them, `_wake_for_grace`: the tick alone would say it up to a tick late)."""
        if len(self._grace) > 2 * len(self._waiting) + 1024:
            self._grace.retain(self._waiting)
        due = self._grace.due()
        for job_id in due - self._waiting.keys():  # (left waiting unseen: e.g. folded from a rebuild)
            self._grace.forget(job_id)
        return due & self._waiting.keys()

    def _wake_for_grace(self) -> None:
        """A timer that wakes the service when the next held-back first reason is due (one at a time)."""
        wait = self._grace.due_in()
        if wait is None:
            return
        loop = asyncio.get_running_loop()
        at, timer = loop.time() + wait, self._grace_timer
        if timer is None or timer.when() <= loop.time() or timer.when() > at:
            if timer is not None:
                timer.cancel()
            self._grace_timer = loop.call_later(wait + self.grace_batch_seconds, self.changed.set)

    async def _joiners(self, now: float) -> bool:
        """The tick's cycle on a full cluster when only waiting jobs came, went or changed since the
        last full one (`core.joiners`): the jobs that joined are decided with its first job, and
        every other job keeps its answer, recorded already. False: a full cycle is needed."""
        held = self._held
        if held is None or self.view.free_gpus():
            return False
        head, last = held
        first = self._waiting.get(head.job.id)
        if first is None:
            return False
        touched, self._touched = self._touched, set()
        joined = [self._waiting[i] for i in sorted(touched) if i in self._waiting and i != head.job.id]
        snapshot = self.view.snapshot(now, pending=[first, *joined], releasing=True, config=self.config)
        if not (snapshot.cluster is last.cluster or snapshot.cluster == last.cluster) \
                or snapshot.queues != last.queues or snapshot.running != last.running:
            self._touched |= touched
            return False
        decisions = joiners_step(snapshot, self.config, head, memo=self._joiner_classes)
        if decisions is None:
            self._touched |= touched
            return False
        reasons: dict[str, list[Event]] = {}
        for decision in decisions:
            assert isinstance(decision, core.Pending)  # nothing is free: every answer is a reason
            pending = self._reason_event(self.view.jobs[decision.job_id], decision.reason)
            if pending is not None:
                reasons[pending.stream] = [pending]
        if not await self.append(reasons):
            self._held = None
        return True


    def _reserve(self, job: JobView, decision: core.Place,
                 taken: dict[str, set[int]]) -> dict[str, list[Event]] | core.Reason:
        """GangReserved on the job's stream and a GpusAllocated on each node stream it touches (a
        Reason instead when rank 0's node has no free rendezvous port)."""
        stream = job_stream(job.job_id)
        rendezvous = choose_rendezvous(self.view, job.job_id, job.attempt, decision.placement, taken,
                                       self.master_addr)
        if isinstance(rendezvous, core.Reason):
            return rendezvous
        address, port = rendezvous
        gang = self.new_event(
            ev.GangReserved, job_id=job.job_id,
            ranks=[ev.RankPlacement(rank=r.rank, node=r.node, gpus=list(r.gpus)) for r in decision.placement.ranks],
            world_size=len(decision.placement.ranks), master_addr=address, master_port=port,
            attempt=job.attempt, resume_from=job.resume_from)
        batches: dict[str, list[Event]] = {stream: [gang]}
        for node, gpus in decision.placement.gpus_by_node().items():
            batches[node_stream(node)] = [self.new_event(
                ev.GpusAllocated, stream=node_stream(node), causation=gang, node=node, job_id=job.job_id,
                gpus=list(gpus), attempt=job.attempt)]
        return batches


def _same_inventory(known: Any, event: ev.NodeRegistered) -> bool:
    """Whether a registration says nothing new about a known node (then it is not recorded again)."""
    inventory = known.inventory
    ports = (event.rendezvous_ports.low, event.rendezvous_ports.high) if event.rendezvous_ports else None
    return bool(inventory.gpus == event.gpus and inventory.nvlink_domains == event.nvlink_domains
                and inventory.rack == event.rack and inventory.zone == event.zone
                and known.address == event.address and known.rendezvous_ports == ports)


def _at(at: datetime | None) -> float:
    return at.timestamp() if at is not None else 0.0


__all__ = ["Placement"]


def _drain_changes_nothing(node: NodeView, request: ev.NodeDrained | ev.NodeUndrained) -> bool:
    """An undrain of a node taking work, or a drain of a draining node that asks for no more than
    the drain in force. A `--evict` on a node drained without it is recorded: it was dropped as
    "already so", and the operator was told its jobs were asked to move."""
    if isinstance(request, ev.NodeUndrained):
        return not node.draining
    return node.drain is not None and (node.drain.evict or not request.evict)


def _places(job: JobView) -> bool:
    """Whether placement places `job` now: it waits for GPUs holding quota for this attempt."""
    return job.quota_phase is QuotaPhase.RESERVED
