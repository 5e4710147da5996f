"""Preemption: make room for urgent work and for guarantees, with a checkpoint first.

Watches jobs that wait while lower-priority or borrowing jobs run. Each reconcile runs the full
core cycle (fair share, quotas, priorities, reclaim) and acts only on its `Preempt` decisions:
every victim gets a PreemptRequested with its checkpoint signal and a deadline (now + its
checkpoint grace). The node agents signal the workers, which checkpoint and stop; placement
releases the gang once every rank has exited; then this service requeues the victim with
`resume_from` = its last checkpoint. The core guarantees the preemptor fits once the victims are
gone, never picks non-preemptible jobs or jobs inside `min_runtime_seconds`, and never lets the
same preemptor hit a job twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from typing import Any

from corral import core
from corral.contracts import events as ev
from corral.contracts.envelope import Event, Reason, job_stream
from corral.contracts.flow import PREEMPTION, names
from corral.contracts.lifecycle import LifecycleCode
from corral.contracts.routes import consumed_by
from corral.core.preemption import Preemptors
from corral.core.steps import preemption_step
from corral.projection import ClusterView, JobState, JobView, core_running
from corral.services.base import Service
from corral.translate import wire_reason

log = logging.getLogger("corral.preemption")


class Preemption(Service):
    name = "preemption"
    forgets_ended_jobs = True
    keeps_gpu_ledger = False  # its round leaves fenced GPUs out: no GpusReleased sent
    #: What its decisions read (each event's `flow`): not ranks' reports, node mirrors, quota's
    #: records nor waiting jobs' reasons (its search runs the whole cycle over every waiting job).
    #: Its appends (a victim's PreemptRequested, JobRequeued) are guarded by the versions it has
    #: seen: a QuotaReleased after a victim's release loses that race once, re-reads the stream
    #: and decides again.
    consumes = names(consumed_by(PREEMPTION))
    #: At least this long between two victim searches. Each is a whole scheduling cycle over every
    #: waiting job; run after every event batch it starved the other services of CPU under a stream
    #: of submissions. Checkpoint graces are tens of seconds; requeues are not delayed.
    preempt_interval_seconds = 0.5
    #: It decides at most every `preempt_interval_seconds`: gather events in larger batches.
    events_linger = 0.1
    _last_preempt = float("-inf")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: the core's job classes, kept between searches (the view keeps its PendingJob objects)
        self.classes = core.ClassMemo()
        #: The jobs `_requeues` and `_requests` look at, kept by the view as events are folded
        #: (`ClusterView.jobs_where`): listing them from every active job at every reconcile costs
        #: a pass over ~10,000 jobs waiting for quota in the Kueue-shaped run.
        self._to_requeue = self.view.jobs_where(_to_requeue)
        self._waiting = self.view.jobs_where(_waits)
        self._requeue_asked = self.view.jobs_where(_requeue_asked)
        #: The waiting jobs as the victim rule reads them (`core.Preemptors`), kept from the jobs
        #: whose events were folded since the last search (`_touched`): a search runs only when
        #: some waiting job could preempt, which a long backlog of jobs that outrank no running
        #: job never can. None until the first search builds it from every waiting job.
        self._preemptors: Preemptors | None = None
        self._touched: set[str] = set()

    def folded(self, event: Event) -> None:
        job_id = getattr(event, "victim_job_id", None) or getattr(event, "job_id", None)
        if job_id and self._preemptors is not None:
            self._touched.add(job_id)

    async def reconcile(self) -> None:
        # One append for all of this reconcile's decisions (group commit): the requeues, and the
        # preemption requests when a victim search is due. All or nothing: after a lost race the
        # streams are re-read and the next reconcile decides again.
        decisions = self._requeues()
        for stream, events in self._asked_to_move().items():
            decisions.setdefault(stream, []).extend(events)
        wait = self._last_preempt + self.preempt_interval_seconds - self.monotonic()
        if wait > 0:
            asyncio.get_running_loop().call_later(wait, self.changed.set)
        else:
            self._last_preempt = self.monotonic()
            for stream, events in self._requests(asked=decisions.keys()).items():
                decisions.setdefault(stream, []).extend(events)
            # A search over a long backlog takes long: wait a few times its duration before the
            # next one, so victim searches use at most about a fifth of this process's time.
            self._last_preempt += 4 * (self.monotonic() - self._last_preempt)
        if not await self.append(decisions):
            # A lost race re-read the streams (a victim's QuotaReleased, which it is not sent, lands
            # after its release as often as not): decide again on them now, not at the next tick.
            self.changed.set()

    def _requeues(self) -> dict[str, list[Event]]:
        out: dict[str, list[Event]] = {}
        for job in sorted(self._to_requeue.values(), key=lambda j: j.job_id):
            requeued = self.new_event(
                ev.JobRequeued, job_id=job.job_id, attempt=job.attempt + 1, resume_from=job.checkpoint,
                reason=Reason(code=LifecycleCode.PREEMPTED.value,
                              message=f"preempted; resumes from {job.checkpoint or 'the start'}; "
                                      f"{job.lost_gpu_seconds:.0f} GPU-seconds since its last checkpoint lost",
                              details={"resume_from": job.checkpoint or "",
                                       "lost_gpu_seconds": round(job.lost_gpu_seconds, 1)}))
            out[requeued.stream] = [requeued]
        return out

    def _asked_to_move(self) -> dict[str, list[Event]]:
        """Running jobs an operator asked to move: `corral requeue` (a JobRequeueRequested for this
        attempt) or a rank on a node drained with `--evict`. Each is asked to checkpoint and stop
        (PreemptRequested without `for_job_id`), then requeued as any preemption victim is."""
        now = self.clock()
        out: dict[str, list[Event]] = {}
        # Only the jobs holding GPUs (the view keeps them), and of those only the ones asked to
        # requeue (kept too) unless a node is drained with --evict: this runs at every reconcile,
        # ten times a second, and sorting every running job each time cost O(running) per batch.
        evicting = any(node.drain is not None and node.drain.evict for node in self.view.nodes.values())
        candidates = self.view.running_jobs() if evicting else self._requeue_asked.values()
        for job in sorted(candidates, key=lambda j: j.job_id):
            if job.state not in (JobState.STARTING, JobState.RUNNING):
                continue
            reason = _asked_reason(job, self.view)
            if reason is None:
                continue
            grace = job.spec.checkpoint.grace_seconds if job.spec else 30.0
            request = self.new_event(
                ev.PreemptRequested, victim_job_id=job.job_id,
                deadline=datetime.fromtimestamp(now, UTC) + timedelta(seconds=grace),
                signal=job.spec.checkpoint.signal if job.spec else "SIGUSR1", reason=reason)
            log.info("asking %s to checkpoint and move: %s", job.job_id, reason.message)
            out[request.stream] = [request]
        return out

    def _requests(self, asked: Collection[str] = ()) -> dict[str, list[Event]]:
        out: dict[str, list[Event]] = {}
        running = self.view.running_jobs()
        if not self._waiting or not running:
            return out
        now = self.clock()
        if not self._may_preempt(running, now):
            return out
        snapshot = self.view.snapshot(now, pending=list(self._waiting.values()), config=self.config)
        for decision in preemption_step(snapshot, self.config, memo=self.classes):
            for victim_id in decision.victims:
                victim = self.view.jobs.get(victim_id)
                if victim is None or victim.state is JobState.PREEMPTING or not victim.holding:
                    continue
                stream = job_stream(victim_id)
                if stream in out or stream in asked:  # asked already in this reconcile
                    continue
                grace = victim.spec.checkpoint.grace_seconds if victim.spec else 30.0
                signal = victim.spec.checkpoint.signal if victim.spec else "SIGUSR1"
                request = self.new_event(
                    ev.PreemptRequested, victim_job_id=victim_id, for_job_id=decision.job_id,
                    deadline=datetime.fromtimestamp(now, UTC) + timedelta(seconds=grace), signal=signal,
                    reason=wire_reason(decision.reason))
                log.info("preempting %s for %s: %s", victim_id, decision.job_id, decision.reason.message)
                out[stream] = [request]
        return out

    def _may_preempt(self, running: list[JobView], now: float) -> bool:
        """Whether some waiting job could preempt one of `running` (`core.Preemptors.may_preempt`)."""
        return self.preemptors().may_preempt((core_running(j, self.config) for j in running), now, self.config)

    def preemptors(self) -> Preemptors:
        """The waiting jobs as the victim rule reads them, brought up to date with the jobs touched
        since the last call (a job's own events are the only ones that change it)."""
        preemptors = self._preemptors
        if preemptors is None:
            preemptors = self._preemptors = Preemptors(j.core_pending() for j in self._waiting.values())
        else:
            for job_id in self._touched:
                job = self._waiting.get(job_id)
                if job is None:
                    preemptors.discard(job_id)
                else:
                    preemptors.put(job.core_pending())
        self._touched.clear()
        return preemptors

def _asked_reason(job: JobView, view: ClusterView) -> Reason | None:
    """Why an operator wants this running job to checkpoint and move, or None."""
    request = job.requeue_request
    if request is not None and job.requeue_attempt == job.attempt:
        who = request.user or request.actor
        return Reason(code=LifecycleCode.REQUEUE_REQUESTED.value,
                      message=f"requeue requested by {who}" + (f": {request.message}" if request.message else ""),
                      details={"user": who})
    for node in sorted({rank.node for rank in job.ranks}):
        drain = view.nodes[node].drain if node in view.nodes else None
        if drain is not None and drain.evict:
            return Reason(code=LifecycleCode.NODE_DRAINED.value,
                          message=f"node {node} drained with --evict by {drain.user}"
                                  + (f": {drain.message}" if drain.message else ""),
                          details={"node": node, "user": drain.user})
    return None


def _requeue_asked(job: JobView) -> bool:
    """A job holding GPUs whose current attempt an operator asked to requeue (`_asked_reason`)."""
    return job.holding and job.requeue_request is not None and job.requeue_attempt == job.attempt


def _to_requeue(job: JobView) -> bool:
    """A victim whose gang is released: this service requeues it (`Preemption._requeues`)."""
    return job.state is JobState.REQUEUING and job.reason is not None and job.reason.code == LifecycleCode.PREEMPTED


def _waits(job: JobView) -> bool:
    """A job waiting for quota or GPUs, for whom a victim search may preempt (`_requests`)."""
    return job.state is JobState.PENDING and job.spec is not None
