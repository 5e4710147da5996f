"""Quota: the queue tree and the usage ledger; who may take GPUs next, in fair-share order.

Owns the queue tree: QueueTreeApplied (a numbered version of the whole tree, from `corral apply` via
the inbox) with a QueueConfigured per queue it changes, QueueChangeRefused (a change the evidence
gate refused, recorded for the audit), QueueConfigured sent alone (older clients); and QuotaReserved
/ QuotaReleased on job streams. Each reconcile runs the core's quota step (`corral.core.reservation.quota_round`, the
first of the pipeline in `corral.core.steps`): waiting jobs in fair-share order, each checked
against the tree (guarantee, borrowing, lend limits, max_gpus) with the usage of everything
already reserved, and none that the same round's preemption step would take back. A job that
passes gets QuotaReserved and placement may now place it; one that does not gets a
PlacementPending with the quota reason, when that is news (`Service.pending_event`). This module
only picks the step's inputs from the log (who waits, who holds quota) and records its answers.
Quota is given back when a job ends or its GPUs are released (preemption, node loss, restart).
At start it records PolicyInForce when the log names a policy other than the one it decides by.
A job waiting longer than its queue's `max_wait` gets a WaitExceeded with its blocker, once per
wait (`core.escalation`; the fold knows which waits were escalated, also after a restart).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from corral.bus import Delivery, Retry
from corral.contracts import events as ev
from corral.contracts.envelope import (
    POLICY_STREAM,
    QUEUE_GATE_STREAM,
    QUEUE_TREE_STREAM,
    Event,
    Reason,
    queue_stream,
)
from corral.contracts.flow import QUOTA, names
from corral.contracts.queues import merged_tree, tree_problems
from corral.contracts.routes import consumed_by, inbox_of
from corral.contracts.subjects import Subjects
from corral.core import escalation
from corral.core.reservation import QuotaRound, Reserve, Revoke, quota_round
from corral.core.steps import StepMemos
from corral.projection import JobView, QuotaPhase
from corral.services.base import Service
from corral.services.quota import gate
from corral.services.quota.round_inputs import RoundInputs
from corral.services.senders import as_sent_by, sender_of
from corral.translate import wire_reason

log = logging.getLogger("corral.quota")


class Quota(Service):
    name = "quota"
    forgets_ended_jobs = True
    keeps_gpu_ledger = False  # its round leaves fenced GPUs out: no GpusReleased sent
    #: An admin's requests on `admin.<admin>.<Type>` (only an admin identity publishes there; the
    #: admin is recorded as their actor and user); the bare subjects only a superuser may publish.
    inbox = inbox_of(QUOTA)
    events = frozenset({ev.JobAdmitted, ev.JobRequeued, ev.GangReleased, ev.JobCompleted, ev.JobFailed,
                        ev.JobCancelled, ev.QueueConfigured, ev.QueueTreeApplied, ev.QueueChangeRefused,
                        ev.NodeRegistered, ev.NodeLost, ev.QuotaReserved, ev.QuotaReleased, ev.GangReserved})
    #: What each event's `flow` sends quota: not ranks' reports nor node mirrors, nor what quota
    #: alone writes (it folds each when it appends it). Its appends are guarded by the versions it
    #: has seen: an unseen event after them loses the race, re-reads the stream and decides again
    #: (a rank's report lands on a job's stream before its end or requeue, which quota sees, so
    #: this is rare). Quota runs as one process: a second one would not see the first's
    #: reservations until it appended to the same job's stream.
    consumes = names(consumed_by(QUOTA))

    async def handle_inbox(self, event: Event, delivery: Delivery) -> None:
        event = as_sent_by(event, sender_of(Subjects(self.bus.namespace), delivery.subject))
        if isinstance(event, ev.QueueTreeApplied):
            await self._apply_tree(event, delivery)
            return
        if not isinstance(event, ev.QueueConfigured):
            return
        tracking = self.tracking(delivery)
        stream = queue_stream(event.queue.name)
        current = self.view.queues.get(event.queue.name)
        if current == event.queue:
            await self.append({}, tracking=tracking)  # unchanged: nothing to record
            return
        if self.view.standing_gates():  # one queue changed is a change of the tree: the gates hold
            await self._apply_tree(ev.QueueTreeApplied.new(
                stream=QUEUE_TREE_STREAM, actor=event.actor, correlation_id="queues", causation=event,
                queues=[event.queue], user=event.actor, now=event.occurred_at), delivery)
            return
        event = msgspec.structs.replace(event, stream=stream)
        if not await self.append({stream: [event]}, tracking=tracking):
            raise Retry("queue stream moved on; retrying", delay=0.05)

    async def _apply_tree(self, event: ev.QueueTreeApplied, delivery: Delivery) -> None:
        """Record version N+1 of the tree: the whole tree after this change (the queues named, over
        the current ones: queues are never deleted) and a QueueConfigured for each queue it changes,
        in one transaction, so that `queues` and the version history can never disagree."""
        changed = [q for q in event.queues if self.view.queues.get(q.name) != q]
        whole = merged_tree(self.view.queues.values(), event.queues)
        problems = tree_problems(whole)
        if problems:
            # Checked by `corral apply` too; a request from another client is checked here, and an
            # inconsistent tree (children promised more than their parent has) is never recorded.
            said = "; ".join(f"{whole[int(p.path.split(']')[0].removeprefix('queues['))].name}: {p.message}"
                             for p in problems)
            await self._refuse(event, delivery, f"the tree would be inconsistent: {said}", [])
            return
        verdict = await gate.judge(self.store, self.view, event, whole)
        if verdict.refused is not None:
            await self._refuse(event, delivery, verdict.refused, verdict.checks)
            return
        gates = event.gates if event.gates is not None else self.view.standing_gates()
        version = msgspec.structs.replace(event, stream=QUEUE_TREE_STREAM, queues=whole, evidence=verdict.checks,
                                          gates=list(gates) or None)
        batches: dict[str, list[Event]] = {QUEUE_TREE_STREAM: [version]}
        for queue in changed:
            batches[queue_stream(queue.name)] = [ev.QueueConfigured.new(
                stream=queue_stream(queue.name), actor=event.actor, correlation_id=event.event_id,
                causation=event, queue=queue, now=event.occurred_at)]
        if not await self.append(batches, tracking=self.tracking(delivery)):
            raise Retry("queue streams moved on; retrying", delay=0.05)

    async def _refuse(self, event: ev.QueueTreeApplied, delivery: Delivery, why: str,
                      checks: list[ev.GateCheck]) -> None:
        """Record that the change is refused (nothing applied), with the checks that refused it."""
        log.warning("queue tree change by %s refused: %s", event.user, why)
        refused = self.new_event(ev.QueueChangeRefused, stream=QUEUE_GATE_STREAM, causation=event,
                                 correlation_id="queues", queues=list(event.queues), user=event.user,
                                 message=why[:2000], evidence=checks)
        if not await self.append({QUEUE_GATE_STREAM: [refused]}, tracking=self.tracking(delivery)):
            raise Retry("queue gate stream moved on; retrying", delay=0.05)

    #: A reservation round over the whole backlog runs beside the loop and is paced here. The
    #: problem (bench/kueue_baseline.py, 15,000 jobs): a round over thousands of waiting jobs took
    #: seconds (one that must be played out against preemption, see corral.core.reservation,
    #: takes several passes), and it ran on the event loop: meanwhile no event was folded and no
    #: quota given back, and the loop then waited as long again (four times, after a slow round).
    #: A job's quota was given back ~3 s after it ended (held 4.1 s for a 0.2 s job) while its
    #: cohort's waiting jobs were refused MAX_GPUS_EXCEEDED. Now the core decides in a worker
    #: thread on a snapshot taken on the loop (the core is pure: the snapshot is all it reads; a
    #: round over a few jobs is decided on the loop, `inline_jobs`);
    #: the loop goes on folding events and giving quota back; the round's decisions are appended
    #: guarded by the stream versions of its snapshot, so a job whose stream moved on meanwhile
    #: (cancelled, given back) makes the round lose the race and the next round decides again.
    #: The next round starts no sooner than the last took (at most half of this process's time),
    #: and no sooner than `round_interval` after the last started: under a steady stream of events
    #: a cheaper round otherwise only ran more often. A round starts only once an event was
    #: folded since the last round's snapshot (nothing else is an input of its decisions but the
    #: clock; quota's own reasons are not, `_records_only`), or `round_refresh` after the last
    #: started (the clock's part, and reasons the throttle held back), or after a round that did
    #: not finish (the store away).
    paces_itself = True
    round_interval = 0.05
    #: what quota appends that changes no input of a round, only what the log says (the reason a
    #: job waits with, a wait escalated): its own are not a change that makes a round due, else
    #: every round that records a reason starts another that decides the same and records none
    _records_only: tuple[type[Event], ...] = (ev.PlacementPending, ev.WaitExceeded)
    _own = False  # folding this process's own appends (`_fold_appended`)
    round_refresh = 1.0
    _next_reserve = float("-inf")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._touched: set[str] = set()  # jobs an event touched since the last `_release` (`folded`)
        self._inputs = RoundInputs()  # the round's inputs, kept as events are folded
        #: the core's memos of the steps the round plays out, kept from round to round as the
        #: services keep theirs: the waiting jobs' class keys are hashed once, not once a round
        self._memos = StepMemos()
        self._folds = 0  # events folded so far (`folded`)
        self._decided: int | None = None  # `_folds` at the last finished round's snapshot
        self._round_started = float("-inf")
        self._waking: asyncio.TimerHandle | None = None
    _round: asyncio.Task[None] | None = None

    #: While a round holds the GIL in its thread, the event loop gets it back only when the
    #: round's thread is asked to let go, after `sys.getswitchinterval()` (5 ms by default) each
    #: time the loop wakes from I/O: folding a batch of events waited on the GIL a few times
    #: over, and late in the Kueue-shaped run (a backlog of thousands, rounds of ~1.5 s back to
    #: back) quota folded a job's end ~2.6 s after it was recorded. A shorter interval hands the
    #: GIL back sooner, at the cost of more switches for the round.
    switch_interval = 0.0005
    #: A round over at most this many waiting jobs is decided on the loop: it takes a fraction of a
    #: millisecond, less than handing it to a thread and back (two wake-ups, each a scheduling
    #: delay on a busy machine, on the way of every job of a quiet cluster to its GPUs).
    inline_jobs = 32

    async def started(self) -> None:
        sys.setswitchinterval(self.switch_interval)
        await self._record_policy()

    async def _record_policy(self) -> None:
        """Record the cluster's policy (`Settings.policy`) when the log names another: the readers
        that rerun decisions (`corral why`, the evidence gate's what-if) rerun them under it."""
        if self.settings is None or self.view.policy == self.settings.policy:
            return
        log.info("quota: the scheduling policy in force is now %s (the log said %s)",
                 self.settings.policy, self.view.policy)
        recorded = self.new_event(ev.PolicyInForce, stream=POLICY_STREAM, correlation_id="policy",
                                  policy=self.settings.policy)
        if not await self.append({POLICY_STREAM: [recorded]}):
            await self._record_policy()  # the stream moved on (re-read): decide again

    async def reconcile(self) -> None:
        await self._release()
        await self._escalate()
        if self._round is not None:
            if not self._round.done():
                return  # it wakes the loop when it ends
            round_, self._round = self._round, None
            round_.result()  # an unavailable store is the run loop's to wait out; a bug raises
        now = self.monotonic()
        if self._decided == self._folds and now - self._round_started < self.round_refresh:
            self._wake(self._round_started + self.round_refresh - now)  # for the clock's part
            return  # nothing new since the last round's snapshot
        wait = self._next_reserve - now
        if wait > 0:
            asyncio.get_running_loop().call_later(wait, self.changed.set)
            return
        self._round = asyncio.create_task(self._reserve_round(), name="quota-round")

    def _wake(self, after: float) -> None:
        """Reconcile again `after` seconds from now (one timer at a time)."""
        if self._waking is None or self._waking.cancelled() or self._waking.when() <= asyncio.get_running_loop().time():
            self._waking = asyncio.get_running_loop().call_later(after, self.changed.set)

    async def _reserve_round(self) -> None:
        started = self._round_started = self.monotonic()
        seen, self._decided = self._folds, None
        try:
            await self._reserve()
            self._decided = seen
        finally:
            ended = self.monotonic()
            self._next_reserve = max(ended + (ended - started), started + self.round_interval)
            self.changed.set()

    def _fold_appended(self, batches: Mapping[str, Sequence[Event]], bases: Mapping[str, int]) -> None:
        self._own = True
        try:
            super()._fold_appended(batches, bases)
        finally:
            self._own = False

    def folded(self, event: Event) -> None:
        if not (self._own and isinstance(event, self._records_only)):
            self._folds += 1  # a change the next round must see (`reconcile`)
        # the job the view folded the event into (`ClusterView.apply`): only its own events change it
        job_id = getattr(event, "victim_job_id", None) or getattr(event, "job_id", None)
        if job_id is None:
            return
        job = self.view.active.get(job_id)
        if job is not None:
            self._touched.add(job_id)
        self._inputs.update(job_id, job)

    def _gives_back(self, job_id: str) -> JobView | None:
        """The job, if it holds quota it must give back (it ended, or its attempt was released)."""
        job = self.view.active.get(job_id)
        return job if job is not None and job.quota_phase is QuotaPhase.OWED else None

    async def _release(self) -> None:
        """Give back the quota of every job that ended or was released (`_gives_back`).

        Only the jobs an event touched since the last time are looked at (`folded`): whether a
        job must give its quota back changes only with its own events. Every reconcile looked
        at every active job, a tenth of quota's event loop with thousands waiting (py-spy,
        Kueue shape), and a job's end waited behind it."""
        done = sorted((j for i in self._touched if (j := self._gives_back(i)) is not None), key=lambda j: j.job_id)
        # One append for all of this reconcile's decisions: a commit per event was the log's limit.
        batches: dict[str, list[Event]] = {}
        for job in done:
            why = (job.reason.code if job.reason else job.state.value)
            released = self.new_event(
                ev.QuotaReleased, job_id=job.job_id, queue=job.queue, gpus=job.quota_gpus,
                reason=Reason(code="QUOTA_RELEASED", message=f"{job.quota_gpus} GPUs of queue {job.queue} "
                              f"given back ({why})", details={"gpus": job.quota_gpus}))
            batches[released.stream] = [released]
        try:
            await self.append(batches)
        finally:  # a job not given back (a lost race, Postgres away) is looked at again next time
            self._touched = {i for i in self._touched if self._gives_back(i) is not None}

    async def _escalate(self) -> None:
        """A WaitExceeded for each job waiting past its queue's max_wait, with its blocker."""
        limits = self.view.max_waits()
        if all(limit is None for limit in limits.values()):
            return
        now = self.clock()
        batches: dict[str, list[Event]] = {}
        for due in escalation.to_escalate(self.view.waits(), limits, now):
            job = self.view.jobs[due.job_id]
            if job.waiting_since is None:  # never: a Wait is made only for a job with one
                continue
            self._emit(batches, self.new_event(
                ev.WaitExceeded, job_id=job.job_id, queue=job.queue, limit_queue=due.limit_queue,
                attempt=job.attempt, waiting_since=job.waiting_since, max_wait_seconds=due.max_wait,
                waited_seconds=due.waited, blocker=job.reason))
        await self.append(batches)  # after a lost race the streams are re-read; the next reconcile decides again

    async def _reserve(self) -> None:
        """Reserve quota where the core says so."""
        if not self.view.queues:
            return
        inputs = self._inputs
        if not inputs.unreserved:
            return  # every waiting job holds quota: the core decides nothing (reserve_quota)
        snapshot = self.view.snapshot(self.clock(), core_pending=inputs.core_pending(),
                                       running=inputs.core_running(self.view, self.config))
        backlog = inputs.backlog.frozen()  # copies, as the rest: the loop folds events while the core decides
        by_id = dict(inputs.waiting)
        reserved, held = set(inputs.reserved), inputs.held()
        # the versions the decisions are guarded by: a copy of every stream's (a C-level copy; one
        # stream name built per waiting job was a tenth of quota's loop with thousands waiting)
        seen = dict(self.view.versions)
        batches: dict[str, list[Event]] = {}
        decide = functools.partial(quota_round, snapshot, self.config, reserved=reserved, held=held,
                                   memos=self._memos, backlog=backlog)
        round_ = decide() if len(by_id) <= self.inline_jobs else await asyncio.to_thread(decide)
        for decision in round_.decisions:
            job = by_id[decision.job_id]
            if isinstance(decision, Reserve):
                self._emit(batches, self.new_event(ev.QuotaReserved, job_id=job.job_id, queue=job.queue,
                                                   gpus=decision.gpus, borrowed=decision.borrowed))
            elif isinstance(decision, Revoke):
                # it would be started now and taken back at once: it waits without quota
                self._emit(batches, self.new_event(ev.QuotaReleased, job_id=job.job_id, queue=job.queue,
                                                   gpus=job.quota_gpus, reason=wire_reason(decision.reason)))
                if (why := self.pending_event(job, decision.reason)) is not None:
                    self._emit(batches, why)
            elif (why := self.pending_event(job, decision.reason)) is not None:
                self._emit(batches, why)
        self._refusals(round_, by_id, reserved, batches)
        # all or nothing, as of the snapshot: after a lost race the next round decides again
        await self.append(batches, expected={stream: seen.get(stream, 0) for stream in batches})

    def _refusals(self, round_: QuotaRound, by_id: Mapping[str, JobView], reserved: set[str],
                  batches: dict[str, list[Event]]) -> None:
        """A PlacementPending for each waiting job the round refused by class (`QuotaRound.rest`)
        whose reason is news. The waiting jobs are kept grouped by class and recorded reason
        (`RoundInputs.told`): a group told its class's reason word for word is passed over whole
        (`ReasonThrottle.news` would say no to each), so a round over a backlog of thousands looks
        at a few groups, not at every job. A job that came, or held quota, when the snapshot was
        taken (not in `by_id`, in `reserved`) is the next round's to decide."""
        rest, by_user = round_.rest, round_.by_user
        if not rest:
            return
        named = {d.job_id for d in round_.decisions}
        for (queue, gpus, user, code, message), ids in self._inputs.told.items():
            reason = rest.get((queue, gpus, user if by_user else None))
            if reason is None or (code == reason.code and message == reason.message):
                continue
            for job_id in sorted(ids):
                job = by_id.get(job_id)
                if job is None or job_id in named or job_id in reserved or job is not self.view.active.get(job_id):
                    continue
                if (why := self.pending_event(job, reason)) is not None:
                    self._emit(batches, why)

    @staticmethod
    def _emit(batches: dict[str, list[Event]], event: Event) -> None:
        batches.setdefault(event.stream, []).append(event)

