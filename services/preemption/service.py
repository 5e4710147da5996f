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
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from corral import core
from corral.contracts import events as ev
from corral.contracts.envelope import Reason, job_stream
from corral.contracts.lifecycle import LifecycleCode
from corral.projection import JobState
from corral.services.runtime import Service
from corral.translate import wire_reason

log = logging.getLogger("corral.preemption")


class Preemption(Service):
    name = "preemption"
    config = core.SchedulerConfig()
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

    async def reconcile(self) -> None:
        await self._requeue()
        wait = self._last_preempt + self.preempt_interval_seconds - time.monotonic()
        if wait > 0:
            asyncio.get_running_loop().call_later(wait, self.changed.set)
            return
        self._last_preempt = time.monotonic()
        await self._preempt()
        # A search over a long backlog takes long: wait a few times its duration before the next
        # one, so victim searches use at most about a fifth of this process's time.
        self._last_preempt += 4 * (time.monotonic() - self._last_preempt)

    async def _requeue(self) -> None:
        victims = [j for j in self.view.active.values()
                   if j.state is JobState.REQUEUING and j.reason is not None
                   and j.reason.code == LifecycleCode.PREEMPTED]
        for job in sorted(victims, key=lambda j: j.job_id):
            requeued = ev.JobRequeued.new(
                stream=job_stream(job.job_id), actor="preemption", correlation_id=job.job_id,
                job_id=job.job_id, attempt=job.attempt + 1, resume_from=job.checkpoint,
                reason=Reason(code=LifecycleCode.PREEMPTED.value,
                              message=f"preempted; resumes from {job.checkpoint or 'the start'}",
                              details={"resume_from": job.checkpoint or ""}))
            await self.append({requeued.stream: [requeued]})

    async def _preempt(self) -> None:
        waiting = [j for j in self.view.active.values() if j.state is JobState.PENDING and j.spec is not None]
        if not waiting or not self.view.running_jobs():
            return
        now = self.clock()
        snapshot = self.view.snapshot(now, pending=waiting)
        # only Preempt decisions matter here: the core may skip explaining jobs that stay pending
        for decision in core.schedule(snapshot, self.config, explain=False, memo=self.classes):
            if not isinstance(decision, core.Preempt):
                continue
            for victim_id in decision.victims:
                victim = self.view.jobs.get(victim_id)
                if victim is None or victim.state is JobState.PREEMPTING or not victim.holding:
                    continue
                grace = victim.spec.checkpoint.grace_seconds if victim.spec else 30.0
                signal = victim.spec.checkpoint.signal if victim.spec else "SIGUSR1"
                request = ev.PreemptRequested.new(
                    stream=job_stream(victim_id), actor="preemption", correlation_id=victim_id,
                    victim_job_id=victim_id, for_job_id=decision.job_id,
                    deadline=datetime.fromtimestamp(now, UTC) + timedelta(seconds=grace), signal=signal,
                    reason=wire_reason(decision.reason))
                log.info("preempting %s for %s: %s", victim_id, decision.job_id, decision.reason.message)
                await self.append({request.stream: [request]})
