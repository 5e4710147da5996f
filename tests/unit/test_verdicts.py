"""The verdict on a request (`corral.verdicts`) and the per-user scope of submission ids.

Pure parts: which recorded events answer a request and what kind of answer they are; that each
request type's owner is the service that reads it; that a submission id keys on its user in the
fold (and a log whose submissions carry no user still folds); that the msg id a submission is
published with differs between users and is the same for one user's retries."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from corral.contracts import events as ev
from corral.contracts.envelope import Reason, job_stream
from corral.contracts.jobspec import JobSpec
from corral.projection import ClusterView
from corral.services.admission.service import Admission
from corral.services.placement.service import Placement
from corral.services.quota.service import Quota
from corral.submission_ids import submission_msg_id
from corral.verdicts import OWNERS, VerdictKind, answers, decide, verdict_streams


def _spec(**kw: Any) -> JobSpec:
    return msgspec.convert({"name": "n", "queue": "q", "replicas": 1, "gpus_per_replica": 1, "runtime": "sim",
                            "duration_seconds": 5, **kw}, JobSpec)


def _submitted(job: str, user: str | None, submission: str | None) -> ev.JobSubmitted:
    return ev.JobSubmitted.new(stream=job_stream(job), actor=f"user/{user}", job_id=job, user=user,
                               spec=_spec(submission_id=submission), submission_id=submission)


def test_each_request_is_owned_by_the_service_that_reads_it() -> None:
    inboxes = {service.name: {t.rsplit(".", 1)[-1] for t in service.inbox} for service in (Admission, Placement, Quota)}
    for request, owner in OWNERS.items():
        assert request in inboxes[owner], (request, owner)


def test_a_refusal_caused_by_the_request_is_its_verdict() -> None:
    cancel = ev.JobCancelRequested.new(stream=job_stream("j1"), actor="user/alice", job_id="j1", user="alice")
    denied = ev.AccessDenied.new(stream=job_stream("j1"), actor="admission", causation=cancel, user="alice",
                                 request=cancel.type, job_id="j1",
                                 reason=Reason(code="NOT_OWNER", message="alice may not cancel a job of bob"))
    other = ev.JobCancelled.new(stream=job_stream("j1"), actor="admission", job_id="j1",
                                reason=Reason(code="CANCELLED_BY_USER", message="someone else's"))
    assert verdict_streams(cancel) == (job_stream("j1"),)
    assert answers(cancel, denied) and not answers(cancel, other)
    verdict = decide(cancel, [(3, denied)], handled=True)
    assert verdict is not None and verdict.kind is VerdictKind.REFUSED and verdict.version == 3
    assert verdict.reason is not None and verdict.reason.code == "NOT_OWNER"
    assert verdict.as_json()["reason"]["code"] == "NOT_OWNER" and verdict.as_json()["verdict"] == "refused"


def test_recorded_is_done_handled_alone_is_unchanged_and_neither_is_no_answer_yet() -> None:
    cancel = ev.JobCancelRequested.new(stream=job_stream("j1"), actor="user/bob", job_id="j1", user="bob")
    cancelled = ev.JobCancelled.new(stream=job_stream("j1"), actor="admission", job_id="j1", causation=cancel,
                                    reason=Reason(code="CANCELLED_BY_USER", message="by bob"))
    done = decide(cancel, [(4, cancel), (5, cancelled)], handled=True)
    assert done is not None and done.kind is VerdictKind.DONE and done.event == cancelled
    unchanged = decide(cancel, [], handled=True)
    assert unchanged is not None and unchanged.kind is VerdictKind.UNCHANGED and unchanged.job_id == "j1"
    assert decide(cancel, [], handled=False) is None


def test_a_submission_is_judged_by_admission_not_by_its_own_record() -> None:
    submitted = _submitted("j1", "alice", None)
    assert decide(submitted, [(1, submitted)], handled=False) is None
    rejected = ev.JobRejected.new(stream=job_stream("j1"), actor="admission", job_id="j1", causation=submitted,
                                  reason=Reason(code="QUEUE_UNKNOWN", message="no queue q"))
    verdict = decide(submitted, [(1, submitted), (2, rejected)], handled=True)
    assert verdict is not None and verdict.kind is VerdictKind.REFUSED and verdict.event == rejected


def test_a_submission_id_is_its_users_own_in_the_fold() -> None:
    view = ClusterView()
    for version, event in enumerate([_submitted("ja", "alice", "nightly"), _submitted("jb", "bob", "nightly"),
                                     _submitted("jc", "alice", "nightly")], start=1):
        view.apply(event, 1, version)
    assert view.submissions == {("alice", "nightly"): "ja", ("bob", "nightly"): "jb"}


def test_a_log_whose_submissions_name_no_user_still_folds() -> None:
    view = ClusterView()
    view.apply(_submitted("jold", None, "nightly"), 1, 1)
    assert view.submissions == {("", "nightly"): "jold"} and view.jobs["jold"].spec is not None


@given(st.text(min_size=1, max_size=30), st.text(min_size=1, max_size=30), st.text(min_size=1, max_size=200),
       st.binary(max_size=64))
def test_the_msg_id_of_a_submission_is_per_user_and_stable(alice: str, bob: str, submission: str,
                                                           key: bytes) -> None:
    mine = submission_msg_id(alice, submission, key)
    assert mine == submission_msg_id(alice, submission, key)
    assert mine.isascii() and mine.isprintable() and len(mine) <= 64
    if alice != bob:
        assert mine != submission_msg_id(bob, submission, key)
    assert mine != submission_msg_id(alice, submission, key + b"x")
