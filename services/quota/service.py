"""Quota: the queue tree and the usage ledger; who may take GPUs next, in fair-share order.

Owns QueueConfigured (from `corral apply`, via the inbox) and QuotaReserved / QuotaReleased on job
streams. Each reconcile asks the core for the fair-share order of waiting jobs and checks each
against the tree (guarantee, borrowing, lend limits, max_gpus) with the usage of everything
already reserved: a job that passes gets QuotaReserved and placement may now place it; one that
does not gets a PlacementPending with the quota reason, only when that reason changes.
Quota is given back when a job ends or its GPUs are released (preemption, node loss, restart).
"""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec

from corral import core
from corral.bus import Delivery, Retry
from corral.contracts import events as ev
from corral.contracts.envelope import Event, Reason, job_stream, queue_stream
from corral.core.reservation import Reserve, reserve_quota
from corral.projection import JobState
from corral.services.runtime import Service
from corral.translate import wire_reason

log = logging.getLogger("corral.quota")


class Quota(Service):
    name = "quota"
    inbox = ("QueueConfigured",)
    events = ("JobAdmitted", "JobRequeued", "GangReleased", "JobCompleted", "JobFailed", "JobCancelled",
              "QueueConfigured", "NodeRegistered", "NodeLost", "QuotaReserved", "QuotaReleased", "GangReserved")
    config = core.SchedulerConfig()

    async def handle_inbox(self, event: Event, delivery: Delivery) -> None:
        if not isinstance(event, ev.QueueConfigured):
            return
        tracking = self.tracking(delivery)
        stream = queue_stream(event.queue.name)
        current = self.view.queues.get(event.queue.name)
        if current == event.queue:
            await self.append({}, tracking=tracking)  # unchanged: nothing to record
            return
        event = msgspec.structs.replace(event, stream=stream)
        if not await self.append({stream: [event]}, tracking=tracking):
            raise Retry("queue stream moved on; retrying", delay=0.05)

    #: A reservation round that had to be played out against preemption (see
    #: corral.core.reservation) is a whole scheduling cycle over the backlog, like a victim search:
    #: after one that took long, wait a few times its duration before the next, so that it uses
    #: at most about a fifth of this process's time. Cheap rounds are not delayed.
    slow_round_seconds = 0.25
    _next_reserve = float("-inf")

    async def reconcile(self) -> None:
        await self._release()
        wait = self._next_reserve - time.monotonic()
        if wait > 0:
            asyncio.get_running_loop().call_later(wait, self.changed.set)
            return
        took = await self._reserve()
        if took > self.slow_round_seconds:
            self._next_reserve = time.monotonic() + 4 * took

    async def _release(self) -> None:
        # One append for all of this reconcile's decisions: a commit per event was the log's limit.
        batches: dict[str, list[Event]] = {}
        done = [j for j in self.view.active.values() if j.quota_gpus and (j.state.terminal or j.quota_stale)]
        for job in sorted(done, key=lambda j: j.job_id):
            why = (job.reason.code if job.reason else job.state.value)
            released = ev.QuotaReleased.new(
                stream=job_stream(job.job_id), actor="quota", correlation_id=job.job_id, job_id=job.job_id,
                queue=job.queue, gpus=job.quota_gpus,
                reason=Reason(code="QUOTA_RELEASED", message=f"{job.quota_gpus} GPUs of queue {job.queue} "
                              f"given back ({why})", details={"gpus": job.quota_gpus}))
            batches[released.stream] = [released]
        await self.append(batches)

    async def _reserve(self) -> float:
        """Reserve quota where the core says so; returns the seconds the decision took."""
        pending = [j for j in self.view.active.values() if j.state is JobState.PENDING and j.spec is not None]
        if not self.view.queues or not any(not j.quota_gpus for j in pending):
            return 0.0
        # a reservation not given back yet (its job ended, was released or requeued) still counts
        held = [(j.queue, j.quota_gpus) for j in self.view.active.values()
                if j.quota_gpus and not j.holding and (j.state is not JobState.PENDING or j.quota_stale)]
        pending = [j for j in pending if not j.quota_stale]
        snapshot = self.view.snapshot(self.clock(), pending=pending)
        by_id = {j.job_id: j for j in pending}
        reserved = {j.job_id for j in pending if j.quota_gpus}
        batches: dict[str, list[Event]] = {}
        started = time.monotonic()
        decisions = reserve_quota(snapshot, self.config, reserved=reserved, held=held)
        took = time.monotonic() - started
        for decision in decisions:
            job = by_id[decision.job_id]
            if isinstance(decision, Reserve):
                self._emit(batches, ev.QuotaReserved.new(
                    stream=job_stream(job.job_id), actor="quota", correlation_id=job.job_id, job_id=job.job_id,
                    queue=job.queue, gpus=decision.gpus, borrowed=decision.borrowed))
            elif self.reason_news(job, str(decision.reason.code), decision.reason.message):
                self._emit(batches, ev.PlacementPending.new(
                    stream=job_stream(job.job_id), actor="quota", correlation_id=job.job_id, job_id=job.job_id,
                    reason=wire_reason(decision.reason)))
        await self.append(batches)  # all or nothing: after a lost race the next reconcile decides again
        return took

    @staticmethod
    def _emit(batches: dict[str, list[Event]], event: Event) -> None:
        batches.setdefault(event.stream, []).append(event)

