"""Admission: the front door. Every submission is judged once, with a reason naming the field.

Consumes JobSubmitted and JobCancelRequested from the inbox (published by `corral submit` or by any
pipeline, deduplicated by `Nats-Msg-Id`). Appends the submission and the verdict to `job-<id>`
with expected version 0, so a duplicate submission (same job id, or the same user's submission
id) is a no-op, never a second job.
Checks beyond the schema (which decoding already enforced): the queue exists, the priority is
within the queue's `max_priority`, the cluster has as many (matching) GPUs as the job needs
(EXCEEDS_CLUSTER, with both numbers), and the request could ever fit this cluster's shape (the
core's `static_feasibility`) — a job that can never be scheduled is rejected now instead of
pending forever. Then the user's limits in the queues file (`corral.services.admission.limits`):
jobs pending or running (LIMIT_SUBMITTED) and the submission rate (RATE_LIMITED), judged on the
ledger folded from the log with each submission's recorded time, so a replay judges the same. A
submission whose spec breaks the contract is rejected with every problem (SPEC_INVALID,
`corral.services.admission.invalid`) instead of being dead-lettered without a verdict.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from corral import core
from corral.bus import Delivery, Retry
from corral.contracts import events as ev
from corral.contracts.admission import RejectionCode
from corral.contracts.envelope import Event, Reason, job_stream, node_stream, queue_stream
from corral.contracts.flow import ADMISSION, names
from corral.contracts.jobspec import JobSpec
from corral.contracts.problems import ContractError, Problem
from corral.contracts.routes import consumed_by, inbox_of
from corral.contracts.sizes import SPEC_TOO_LARGE, recorded_size, size_problem
from corral.contracts.subjects import Subjects
from corral.core.placement import shape_index
from corral.core.submit_limits import SubmitLedger
from corral.eventstore import Tracking
from corral.projection import ACTS_ON, submission_key
from corral.services.admission.feasibility import ShapeVerdicts
from corral.services.admission.invalid import invalid_message, invalid_submission, start_problems
from corral.services.admission.limits import UserLimitsFold
from corral.services.base import Service
from corral.services.dead_letter_replay import serve_replays
from corral.services.senders import Sender, as_sent_by, sender_of

log = logging.getLogger("corral.admission")


class Admission(Service):
    name = "admission"
    #: `user.*.<Type>` and `admin.*.<Type>`: requests on a subject naming their sender (see
    #: `corral.bus.auth`); the bare subjects are writable only by a superuser (tests, open bus).
    inbox = inbox_of(ADMISSION)
    events = frozenset({ev.NodeRegistered, ev.QueueConfigured})
    #: What judging and cancelling need: nodes, queues, which jobs exist and which have ended.
    consumes = names(consumed_by(ADMISSION))
    relay_after = 0.3  # the lightest deciding service: the relay's host unless a standby is idle
    #: A submission repeating an ended job's submission id is found in the log (`_recorded`).
    forgets_ended_jobs = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: the cluster-wide checks of `judge`, per job shape (`corral.services.admission.feasibility`)
        self._fits = ShapeVerdicts(cluster_checks)
        #: each user's counted jobs and submission buckets, folded from the log
        self.user_limits = UserLimitsFold(self.view)

    def folded(self, event: Event) -> None:
        self.user_limits.fold(event)

    async def handle_undecodable(self, delivery: Delivery, error: ContractError) -> bool:
        """Record a JobRejected (SPEC_INVALID) for a submission whose spec breaks the contract:
        True when `delivery` was one (and is handled)."""
        found = invalid_submission(bytes(delivery.data))
        if found is None:
            return False
        job_id, problems = found
        stream = job_stream(job_id)
        tracking = self.tracking(delivery)
        if self.view.versions.get(stream, 0) > 0:
            await self.append({}, tracking=tracking)  # the job exists: a duplicate
            return True
        rejected = self.new_event(ev.JobRejected, stream=stream, job_id=job_id, problems=problems,
                                  reason=Reason(code=RejectionCode.SPEC_INVALID, message=invalid_message(problems),
                                                details={"problems": len(problems)}))
        log.warning("job %s: submission refused: %s", job_id, rejected.reason.message)
        await self.append({stream: [rejected]}, tracking=tracking, expected={stream: 0})
        return True

    async def handle_inbox(self, event: Event, delivery: Delivery) -> None:
        tracking = self.tracking(delivery)
        sender = self._sender(delivery)
        event = as_sent_by(event, sender)
        if isinstance(event, ev.JobSubmitted):
            await self._admit(event, tracking)
        elif isinstance(event, ev.JobCancelRequested):
            await self._cancel(event, tracking, sender=sender)
        elif isinstance(event, ev.JobHeld | ev.JobHoldReleased | ev.JobRequeueRequested):
            await self._hold(event, tracking, sender=sender)

    async def started(self) -> None:
        await serve_replays(self.bus)  # admins' `corral dlq replay` (a service republishes)

    def _sender(self, delivery: Delivery) -> Sender | None:
        return sender_of(Subjects(self.bus.namespace), delivery.subject)

    async def handle_inbox_batch(self, items: Sequence[tuple[Event, Delivery]]) -> list[BaseException | None]:
        """Every submission of a fetched batch judged and appended in ONE commit (a commit per
        submission was admission's limit under a stream of them). A batch with a cancellation in it
        is handled one by one, in order, as before."""
        items = [(as_sent_by(event, self._sender(delivery)), delivery) for event, delivery in items]
        submits = [i for i, (event, _) in enumerate(items) if isinstance(event, ev.JobSubmitted)]
        if len(submits) < 2 or len(submits) != len(items):
            return await super().handle_inbox_batch(items)
        await self._catch_up_queues(event for event, _ in items if isinstance(event, ev.JobSubmitted))
        batches: dict[str, list[Event]] = {}
        trackings: list[Tracking] = []
        seen: set[tuple[str, str]] = set()
        recorded = await self._recorded([e for e, _ in items if isinstance(e, ev.JobSubmitted)])
        ledger = self.user_limits.ledger.scratch()  # the batch's verdicts count for the ones after them
        for i in submits:
            submitted, delivery = items[i]
            assert isinstance(submitted, ev.JobSubmitted)
            trackings.append(self.tracking(delivery))
            stream = job_stream(submitted.job_id)
            submitted = self._as_received(submitted, stream)
            key = submission_key(submitted)
            if stream in batches or self._duplicate(submitted, recorded) or key in seen:
                log.info("job %s already submitted; duplicate ignored", submitted.job_id)
                continue  # its tracking row only
            if key is not None:
                seen.add(key)
            refused = self.refuse_oversized(submitted) or self.refuse_unstartable(submitted)
            if refused:
                batches[stream] = [refused]
                continue
            verdict = await self._judge_caught_up(submitted, ledger)
            self.user_limits.judged(ledger, submitted, verdict)
            batches[stream] = [submitted, verdict]
        if await self.append_handled(batches, trackings):
            return [None] * len(items)
        return await super().handle_inbox_batch(items)

    def _as_received(self, submitted: ev.JobSubmitted, stream: str) -> ev.JobSubmitted:
        """The submission on its job's stream, dated when admission received it.

        The submit time orders FIFO and fair-share waits and starts the job's max_wait, so it is
        never the sender's `occurred_at`: a submission dated 1970 would jump every queue and be
        escalated at once; one dated 2100 would never be."""
        return msgspec.structs.replace(submitted, stream=stream,
                                       occurred_at=datetime.fromtimestamp(self.clock(), UTC))

    async def _admit(self, submitted: ev.JobSubmitted, tracking: Tracking) -> None:
        stream = job_stream(submitted.job_id)
        submitted = self._as_received(submitted, stream)
        if self._duplicate(submitted, await self._recorded([submitted])):
            log.info("job %s already submitted; duplicate ignored", submitted.job_id)
            await self.append({}, tracking=tracking)
            return
        refused = self.refuse_oversized(submitted) or self.refuse_unstartable(submitted)
        if refused is not None:
            await self.append({stream: [refused]}, tracking=tracking, expected={stream: 0})
            return
        await self._catch_up_queues([submitted])
        verdict = await self._judge_caught_up(submitted)
        appended = await self.append({stream: [submitted, verdict]}, tracking=tracking, expected={stream: 0})
        if not appended:
            log.info("job %s: submitted concurrently; duplicate ignored", submitted.job_id)

    def _duplicate(self, submitted: ev.JobSubmitted, recorded: Collection[tuple[str, str]]) -> bool:
        """The job exists already, or its user has submitted under this submission id before
        (`submission_key`: another user's equal id is another job; `recorded`: the keys found in
        the log). Recorded as handled, nothing more: the sender finds the first job by its id
        (`Client.job_of_submission`)."""
        key = submission_key(submitted)
        return self.view.versions.get(submitted.stream, 0) > 0 or (
            key is not None and (key in self.view.submissions or key in recorded))

    async def _recorded(self, submissions: Iterable[ev.JobSubmitted]) -> Collection[tuple[str, str]]:
        """The submission keys of `submissions` that the log holds and the fold does not: those of
        jobs it forgot (over: `forgets_ended_jobs`). One indexed lookup for them all."""
        keys = {k for s in submissions if (k := submission_key(s)) is not None and k not in self.view.submissions}
        return (await self.store.jobs_of_submissions(sorted(keys))).keys() if keys else ()

    def refuse_oversized(self, submitted: ev.JobSubmitted) -> ev.JobRejected | None:
        """A JobRejected if the submission, as the log and the bus would record it, is over the
        size limit. Then only the rejection is recorded, never the submission itself: an event
        too large for the bus would stop the outbox relay (see `corral.contracts.sizes`)."""
        limit = self.bus.limits.max_spec_bytes
        size = recorded_size(submitted)
        problem = size_problem(size, limit)
        if problem is None:
            return None
        log.warning("job %s: submission of %d bytes refused (limit %d)", submitted.job_id, size, limit)
        return self.new_event(
            ev.JobRejected, stream=submitted.stream, causation=submitted, job_id=submitted.job_id,
            problems=[problem],
            reason=Reason(code=SPEC_TOO_LARGE, message=f"{problem.message}; {problem.hint}",
                          details={"bytes": size, "limit": limit}))

    def refuse_unstartable(self, submitted: ev.JobSubmitted) -> ev.JobRejected | None:
        """A JobRejected (SPEC_INVALID) if the spec asks for what the node agent would refuse to
        start (`JobSpec.start_problems`, which decoding leaves out so the log always decodes); then
        only the rejection is recorded, as for a spec that does not decode."""
        problems = start_problems(submitted.spec)
        if not problems:
            return None
        rejected = self.new_event(
            ev.JobRejected, stream=submitted.stream, causation=submitted, job_id=submitted.job_id,
            problems=problems, reason=Reason(code=RejectionCode.SPEC_INVALID, message=invalid_message(problems),
                                             details={"problems": len(problems)}))
        log.warning("job %s: submission refused: %s", submitted.job_id, rejected.reason.message)
        return rejected

    async def _catch_up_queues(self, submissions: Iterable[ev.JobSubmitted]) -> None:
        """Read a queue we have not heard of from the log before judging by it: our view follows
        the bus, which may lag the log (a queue created just before the submission)."""
        for queue in {s.spec.queue for s in submissions} - set(self.view.queues):
            await self.refresh_stream(queue_stream(queue))

    async def _judge_caught_up(self, submitted: ev.JobSubmitted, ledger: SubmitLedger | None = None) -> Event:
        """`judge`, but a "can never fit" verdict only after reading nodes we may not have heard
        of yet from the log (a rejection is final; our view of the nodes may lag the log)."""
        verdict = self.judge(submitted, ledger)
        if isinstance(verdict, ev.JobRejected) and not verdict.reason.code.startswith("QUEUE_") \
                and verdict.reason.code not in _NOT_ABOUT_NODES:
            registered = await self.store.read_all(0, limit=100_000, types=[ev.NodeRegistered.type_name()])
            unknown = {e.stream for e in registered} - {node_stream(n) for n in self.view.nodes}
            for stream in sorted(unknown):
                await self.refresh_stream(stream)
            if unknown:
                verdict = self.judge(submitted, ledger)
        return verdict

    def judge(self, submitted: ev.JobSubmitted, ledger: SubmitLedger | None = None) -> Event:
        spec = submitted.spec
        common: dict[str, Any] = {"stream": submitted.stream, "causation": submitted, "job_id": submitted.job_id}
        problems: list[Problem] = []
        reason: Reason | None = None
        if spec.queue not in self.view.queues:
            known = ", ".join(sorted(self.view.queues)) or "none yet"
            problems.append(Problem(path="queue", message=f"queue `{spec.queue}` does not exist",
                                    hint=f"use one of: {known} (or create it with `corral apply queues.yaml`)"))
            reason = Reason(code=RejectionCode.QUEUE_UNKNOWN,
                            message=f"queue `{spec.queue}` does not exist; known: {known}",
                            details={"queue": spec.queue})
        elif spec.queue in _non_leaf(self.view.queues):
            child = _first_child(self.view.queues, spec.queue)
            problems.append(Problem(path="queue", message=f"queue `{spec.queue}` has child queues",
                                    hint=f"submit to a leaf queue such as {child}"))
            reason = Reason(code=RejectionCode.QUEUE_NOT_LEAF, message=f"queue `{spec.queue}` is not a leaf queue")
        if reason is None:
            found = priority_above_cap(spec, self.view.queues[spec.queue].max_priority)
            if found is not None:
                problem, reason = found
                problems.append(problem)
        if reason is None:
            refused = queue_access_refused(self.view.queues[spec.queue], submitted.user)
            if refused is not None:
                problems.append(refused[0])
                reason = refused[1]
        job = _core_job(submitted) if reason is None and self.view.nodes else None
        shortfall, blocked = self._fits(job, self.view.cluster()) if job is not None else (None, None)
        if shortfall is not None:
            problem, reason = shortfall
            problems.append(problem)
        if reason is None and blocked is not None:
            field = "topology" if blocked.code is core.ReasonCode.TOPOLOGY_UNSATISFIABLE else "gpu"
            if blocked.code is core.ReasonCode.GANG_DOES_NOT_FIT:
                field = "replicas"
            problems.append(Problem(path=field, message=blocked.message,
                                    hint="ask for a shape this cluster has (see `corral nodes`)"))
            reason = Reason(code=str(blocked.code), message=f"can never be scheduled: {blocked.message}",
                            details=dict(blocked.details))
        if reason is None:
            over = self.user_limits.judge(submitted, ledger)
            if over is not None:
                problems.append(over[0])
                reason = over[1]
        if reason is not None:
            return self.new_event(ev.JobRejected, reason=reason, problems=problems, **common)
        return self.new_event(ev.JobAdmitted, queue=spec.queue, priority=int(spec.priority), replicas=spec.replicas,
                              gpus_per_replica=spec.gpus_per_replica, **common)

    async def _cancel(self, request: ev.JobCancelRequested, tracking: Tracking, *,
                      sender: Sender | None = None) -> None:
        # We are sent only some of a job's events (`consumes`): read the rest before deciding.
        await self.refresh_stream(job_stream(request.job_id))
        job = self.view.jobs.get(request.job_id)
        if job is None or job.state.terminal:
            await self.append({}, tracking=tracking)
            return
        stream = job_stream(request.job_id)
        denied = cancel_denied(sender, job.user)
        if denied is not None:
            log.warning("job %s: cancel by %s refused: %s", request.job_id, request.actor, denied.message)
            refusal = self.new_event(ev.AccessDenied, stream=stream, causation=request,
                                     correlation_id=request.job_id, user=request.user or "unknown",
                                     request=request.type, job_id=request.job_id, reason=denied)
            if not await self.append({stream: [refusal]}, tracking=tracking):
                raise Retry("job stream moved on; recording the refusal again", delay=0.05)
            return
        actor = request.actor if sender is not None else f"user/{request.user}" if request.user else None
        cancelled = self.new_event(
            ev.JobCancelled, stream=stream, actor=actor,
            causation=request, correlation_id=request.job_id, job_id=request.job_id,
            reason=Reason(code="CANCELLED_BY_USER", message=request.message or "cancelled by request",
                          details={"user": request.user or "unknown"}))
        if not await self.append({stream: [request, cancelled]}, tracking=tracking):
            raise Retry("job stream moved on; retrying the cancellation", delay=0.05)


    async def _hold(self, request: ev.JobHeld | ev.JobHoldReleased | ev.JobRequeueRequested, tracking: Tracking, *,
                    sender: Sender | None = None) -> None:
        """Record a hold (a pending job), its release (a held job) or a requeue request (a job
        holding GPUs) as the request itself, on the job's stream; anything else (the job runs, ended,
        is not held) changes nothing."""
        stream = job_stream(request.job_id)
        await self.refresh_stream(stream)
        job = self.view.jobs.get(request.job_id)
        if job is None or job.state not in ACTS_ON[type(request)]:
            log.info("job %s: %s ignored: the job is %s", request.job_id, request.type,
                     job.state.value if job else "unknown")
            await self.append({}, tracking=tracking)
            return
        denied = cancel_denied(sender, job.user, type(request))
        if denied is not None:
            refusal = ev.AccessDenied.new(stream=stream, actor="admission", causation=request,
                                          correlation_id=request.job_id, user=request.user or "unknown",
                                          request=request.type, job_id=request.job_id, reason=denied)
            if not await self.append({stream: [refusal]}, tracking=tracking):
                raise Retry("job stream moved on; recording the refusal again", delay=0.05)
            return
        # Admission's own event, caused by the request: the sender's event id and time were recorded
        # as sent, and a release's time restarts the job's wait (a release dated 2100 kept it from
        # ever passing its queue's max_wait). Its words are kept, cut to `REQUEST_MESSAGE_LIMIT`.
        recorded = self.new_event(type(request), stream=stream, actor=request.actor, causation=request,
                                  correlation_id=request.job_id, job_id=request.job_id, user=request.user,
                                  message=request.message[:REQUEST_MESSAGE_LIMIT])
        if not await self.append({stream: [recorded]}, tracking=tracking):
            raise Retry("job stream moved on; retrying the hold", delay=0.05)


#: Rejections that say nothing of the nodes: no reason to read nodes we may not have heard of.
_NOT_ABOUT_NODES = frozenset({RejectionCode.LIMIT_SUBMITTED, RejectionCode.RATE_LIMITED,
                              RejectionCode.PRIORITY_ABOVE_QUEUE_MAX, RejectionCode.ACCESS_DENIED_QUEUE})

#: Characters of an operator's `--message` kept in the recorded hold, release or requeue.
REQUEST_MESSAGE_LIMIT = 1000


def priority_above_cap(spec: JobSpec, max_priority: int | None) -> tuple[Problem, Reason] | None:
    """A job asking for more priority than its queue allows: the field, the cap and the fix."""
    if max_priority is None or int(spec.priority) <= max_priority:
        return None
    message = (f"priority {int(spec.priority)} is above the `max_priority` {max_priority} of queue "
               f"`{spec.queue}`")
    return (Problem(path="priority", message=message,
                    hint=f"ask for a priority of at most {max_priority}, or raise the queue's max_priority"),
            Reason(code=RejectionCode.PRIORITY_ABOVE_QUEUE_MAX, message=message,
                   details={"priority": int(spec.priority), "max_priority": max_priority, "queue": spec.queue}))


def cluster_checks(job: core.Job, cluster: core.Cluster) -> tuple[tuple[Problem, Reason] | None, core.Reason | None]:
    """What `judge` asks of the whole cluster: `capacity_shortfall`, then `core.static_feasibility`
    over every registered node, lost ones too (`shape_index`): a rejection is final, and a lost
    node may come back (the agent process hosting it restarting)."""
    return capacity_shortfall(job, cluster), core.static_feasibility(cluster, job, shape_index(cluster))


def capacity_shortfall(job: core.Job, cluster: core.Cluster) -> tuple[Problem, Reason] | None:
    """A job needing more GPUs than the whole cluster has (of the model/memory it asks for).

    Checked before the shape (`static_feasibility`), whose TOPOLOGY_UNSATISFIABLE named no numbers
    for what is plainly a count: "needs 64 GPUs; the cluster has 60". Every registered node
    counts, lost ones too: a rejection is final, a lost node may come back.
    """
    request = job.gpu
    have = sum(1 for node in cluster.nodes for gpu in node.gpus if request is None or request.matches(gpu))
    need = job.total_gpus
    if need <= have:
        return None
    what = f" {request.describe()}" if request is not None else ""
    message = f"needs {need}{what} GPUs; the cluster has {have}"
    field = "replicas" if job.replicas > 1 else "gpus_per_replica"
    return (Problem(path=field, message=message,
                    hint=f"ask for at most {have} GPUs in all (replicas x gpus_per_replica; see `corral nodes`)"),
            Reason(code=RejectionCode.EXCEEDS_CLUSTER, message=f"can never be scheduled: {message}",
                   details={"needs_gpus": need, "cluster_gpus": have}))
def cancel_denied(sender: Sender | None, owner: str | None,
                  request: type[Event] = ev.JobCancelRequested) -> Reason | None:
    """Only the job's owner or an admin (a request on an admin subject) cancels (holds, releases,
    requeues) it; None when allowed (a sender-less request came on a subject only a superuser may
    publish to)."""
    if sender is None or sender.admin or sender.name == owner:
        return None
    verb = {ev.JobHeld: "hold", ev.JobHoldReleased: "release", ev.JobRequeueRequested: "requeue"}.get(request, "cancel")
    return Reason(code=RejectionCode.NOT_OWNER, message=f"{sender.name} may not {verb} a job of "
                  f"{owner or 'another user'}: only its owner or an admin may",
                  details={"user": sender.name, "owner": owner or "unknown"})


def queue_access_refused(queue: Any, user: str | None) -> tuple[Problem, Reason] | None:
    """The queues file names who may submit to a queue (`submitters`; its highest priority is
    `priority_above_cap`'s); None when this submitter may. An admin submits as a person: to use
    such a queue, it lists itself."""
    submitters = queue.submitters
    if submitters is not None and user not in submitters:
        return (Problem(path="queue", message=f"{user or 'an unnamed user'} may not submit to queue `{queue.name}`",
                        hint=f"submit to a queue that lists you, or ask an admin (allowed: {', '.join(submitters)})"),
                Reason(code=RejectionCode.ACCESS_DENIED_QUEUE, message=f"{user} may not submit to queue `{queue.name}`",
                       details={"user": user or "unknown", "queue": queue.name}))
    return None


def _non_leaf(queues: Mapping[str, object]) -> set[str]:
    return {q.rsplit("/", 1)[0] for q in queues if "/" in q}


def _first_child(queues: Mapping[str, object], parent: str) -> str:
    return next(q for q in sorted(queues) if q.startswith(parent + "/"))


def _core_job(submitted: ev.JobSubmitted) -> core.Job | None:
    from corral.translate import job_from_spec

    try:
        return job_from_spec(submitted.job_id, submitted.spec, submitted.occurred_at.timestamp())
    except ValueError:
        return None
