"""What became of a request: the owning service's verdict, as the log records it.

A request (submit, cancel, hold, release, requeue, drain, undrain, apply) is a message to one
service's inbox. That service records what it decided in the log in the same transaction as its
tracking row for the message (`corral.eventstore.Tracking`, keyed by the message's Nats-Msg-Id),
so the log alone answers, for any request, one of four things:

- DONE: the service recorded the request (or its effect, e.g. JobAdmitted for a submission);
- REFUSED: it recorded a refusal caused by the request (AccessDenied, JobRejected,
  QueueChangeRefused), with the reason;
- UNCHANGED: it handled the message and recorded nothing, because the request would change
  nothing (the job is over or not in the state the request acts on, the node already drains,
  the submission is a duplicate);
- NO_VERDICT: none of these within the wait: the request waits in the inbox (the service is down
  or behind) and may still be acted on.

Deciding the kind from what was read is pure (`decide`); `read_verdict` does the reading, for
`corral.client.Client.await_verdict` and for the local gateway, which answers for its people.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from corral.contracts import events as ev
from corral.contracts.envelope import QUEUE_GATE_STREAM, QUEUE_TREE_STREAM, Event, Reason, job_stream, node_stream
from corral.contracts.flow import flow_of
from corral.contracts.problems import ContractError
from corral.contracts.registry import decode
from corral.eventstore import EventStore, StoredEvent

__all__ = ["OWNERS", "Verdict", "VerdictKind", "answers", "decide", "read_verdict", "verdict_streams"]


class VerdictKind(StrEnum):
    DONE = "done"
    REFUSED = "refused"
    UNCHANGED = "unchanged"
    NO_VERDICT = "no_verdict"


#: The service that handles each request type: its name is the consumer of the tracking row that
#: says the request was handled (tests/unit/test_verdicts.py checks it against each `inbox`).
OWNERS: dict[str, str] = {
    cls.type_name(): flow_of(cls).writers[0]
    for cls in (ev.JobSubmitted, ev.JobCancelRequested, ev.JobHeld, ev.JobHoldReleased, ev.JobRequeueRequested,
                ev.NodeDrained, ev.NodeUndrained, ev.GpuDrained, ev.GpuUndrained, ev.QueueTreeApplied)
}

#: Recorded events that answer a request with "no".
_REFUSALS = (ev.AccessDenied, ev.JobRejected, ev.QueueChangeRefused)
#: What a submission's verdict is (its JobSubmitted, recorded with it, is not).
_SUBMISSION_VERDICTS = (ev.JobAdmitted, ev.JobRejected)


@dataclass(frozen=True)
class Verdict:
    """The owning service's answer to `request`. `event` is the recorded event that decides it
    (None for UNCHANGED and NO_VERDICT) and `version` its version in its stream; `job_id` is the
    job the answer is about (for a duplicate submission, the job its submission id created)."""

    request: Event
    kind: VerdictKind
    event: Event | None = None
    version: int | None = None
    job_id: str | None = None

    @property
    def reason(self) -> Reason | None:
        """Why it was refused: the refusal's reason (a queue change refused carries words only)."""
        if isinstance(self.event, ev.AccessDenied | ev.JobRejected):
            return self.event.reason
        if isinstance(self.event, ev.QueueChangeRefused):
            return Reason(code="QUEUE_CHANGE_REFUSED", message=self.event.message or "the queue change was refused")
        return None

    @property
    def refused(self) -> bool:
        return self.kind is VerdictKind.REFUSED

    def as_json(self) -> dict[str, Any]:
        reason = self.reason
        return {"verdict": self.kind.value, "request": self.request.type, "request_id": self.request.event_id,
                "recorded": self.event.type if self.event is not None else None,
                "reason": None if reason is None else {"code": reason.code, "message": reason.message,
                                                       "details": dict(reason.details)}}


def verdict_streams(request: Event) -> tuple[str, ...]:
    """The streams where the owner of `request` records its verdict."""
    job_id = getattr(request, "job_id", None)
    if isinstance(request, ev.NodeDrained | ev.NodeUndrained | ev.GpuDrained | ev.GpuUndrained):
        return (node_stream(request.node),)
    if isinstance(request, ev.QueueTreeApplied):
        return (QUEUE_TREE_STREAM, QUEUE_GATE_STREAM)
    if job_id is not None:
        return (job_stream(job_id),)
    raise ValueError(f"{request.type} is not a request with a verdict")


def answers(request: Event, event: Event | StoredEvent) -> bool:
    """Whether `event` (read from a `verdict_streams` stream) is the owner's record of `request`:
    the request itself as recorded (same event id) or an event it caused."""
    return request.event_id in (event.event_id, event.causation_id)


def decide(request: Event, recorded: Sequence[tuple[int, Event]], handled: bool) -> Verdict | None:
    """The verdict from the (stream version, event) pairs that `answers` the request, read after
    learning whether its owner has `handled` the message; None: not yet. Handled and recorded in
    one transaction, so handled with nothing recorded means the request changed nothing."""
    if isinstance(request, ev.JobSubmitted):  # the submission is recorded with its verdict
        recorded = [(v, e) for v, e in recorded if isinstance(e, _SUBMISSION_VERDICTS)]
    job_id = getattr(request, "job_id", None)
    for version, event in recorded:
        if isinstance(event, _REFUSALS):
            return Verdict(request, VerdictKind.REFUSED, event, version, job_id)
    if recorded:
        version, event = recorded[-1]
        return Verdict(request, VerdictKind.DONE, event, version, job_id)
    if handled:
        return Verdict(request, VerdictKind.UNCHANGED, job_id=job_id)
    return None


#: How often `read_verdict` looks at the log, at first and at most (seconds). A verdict is
#: usually recorded 10-40 ms after the request: a first look at 50 ms made every `corral submit`
#: and `cancel` wait that long; looks at 10, 30, 70, 150 ms... cost a few indexed reads.
POLL_SECONDS = (0.01, 0.5)


async def read_verdict(store: EventStore, request: Event, msg_id: str, timeout: float) -> Verdict:
    """The verdict on `request`, published with Nats-Msg-Id `msg_id`, read from the log within
    `timeout` seconds (NO_VERDICT after). A submission its owner handled without recording (a
    duplicate of its user's submission id) is answered with the verdict on the job that id
    created, `job_of_submission`."""
    owner = OWNERS[request.type]
    deadline = time.monotonic() + timeout
    after = dict.fromkeys(verdict_streams(request), 1)
    recorded: list[tuple[int, Event]] = []
    interval = POLL_SECONDS[0]
    # Listening before the first look: a verdict recorded while it reads wakes the pause after it
    # (the owner records it a few ms after the request is stored, often during that look).
    await store.listen()
    while True:
        handled = await store.was_processed(owner, msg_id)  # first: its records are then visible
        for stream in after:
            for stored in await store.read_stream(stream, after[stream]):
                after[stream] = stored.version + 1
                if not answers(request, stored):
                    continue
                try:
                    recorded.append((stored.version, decode(stored.data)))
                except ContractError:
                    continue
        verdict = decide(request, recorded, handled)
        if verdict is not None and isinstance(request, ev.JobSubmitted) and verdict.kind is VerdictKind.UNCHANGED:
            verdict = await _first_submission_verdict(store, request, verdict)
        if verdict is not None:
            return verdict
        if time.monotonic() > deadline:
            return Verdict(request, VerdictKind.NO_VERDICT, job_id=getattr(request, "job_id", None))
        await store.pause(interval)
        interval = min(interval * 2, POLL_SECONDS[1])


async def _first_submission_verdict(store: EventStore, request: ev.JobSubmitted, unchanged: Verdict) -> Verdict:
    """For a submission handled as a duplicate, the verdict on the job it duplicates: the one its
    user's submission id created, else the job of its own job id, if that job is the same user's."""
    submission = request.submission_id or request.spec.submission_id
    first = await store.job_of_submission(request.user or "", submission) if submission else None
    verdict: Verdict | None = None
    for stored in await store.read_stream(job_stream(first or request.job_id)):
        try:
            event = decode(stored.data)
        except ContractError:
            continue
        if isinstance(event, ev.JobSubmitted) and (event.user or "") != (request.user or ""):
            return unchanged  # another user's job: nothing of it is this request's answer
        if isinstance(event, _SUBMISSION_VERDICTS) and verdict is None:
            kind = VerdictKind.REFUSED if isinstance(event, ev.JobRejected) else VerdictKind.DONE
            verdict = Verdict(request, kind, event, stored.version, first or request.job_id)
    return verdict or Verdict(request, VerdictKind.UNCHANGED, job_id=first or request.job_id)
