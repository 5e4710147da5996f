"""Admission's per-user limits are a fold of the log: the same events give the same verdicts.

A live admission judges each submission on the ledger it folded so far, dated by the time it
recorded the submission; a new process folding the same log (a restart, a replay) must reach the
same ledger, and so judge the next submission the same way, whatever its own clock says.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from corral.contracts import events as ev
from corral.contracts.envelope import Event, Reason, job_stream, queue_stream
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.queues import validate_queues
from corral.projection import ClusterView
from corral.services.admission.limits import UserLimitsFold

T0 = datetime(2026, 12, 7, tzinfo=UTC)
SPEC = validate_job_spec({"name": "x", "queue": "team/a", "runtime": "sim", "duration_seconds": 5})


def configured() -> list[Event]:
    tree = validate_queues({"queues": [
        {"name": "team", "max_submitted_per_user": 4},
        {"name": "team/a", "submit_rate_per_user": {"per_minute": 6, "burst": 3}}]}).resolved()
    return [ev.QueueConfigured.new(stream=queue_stream(q.name), actor="quota", queue=q, now=T0) for q in tree]


def submitted(n: int, user: str, at: float) -> ev.JobSubmitted:
    return ev.JobSubmitted.new(stream=job_stream(f"j{n}"), actor=f"user/{user}", job_id=f"j{n}", spec=SPEC,
                               user=user, now=T0 + timedelta(seconds=at))


def verdict_of(fold: UserLimitsFold, s: ev.JobSubmitted) -> Event:
    over = fold.judge(s)
    if over is not None:
        return ev.JobRejected.new(stream=s.stream, actor="admission", job_id=s.job_id, reason=over[1],
                                  problems=[over[0]], now=s.occurred_at)
    return ev.JobAdmitted.new(stream=s.stream, actor="admission", job_id=s.job_id, queue=s.spec.queue,
                              priority=500, replicas=1, gpus_per_replica=1, now=s.occurred_at)


def folded(events: list[Event]) -> UserLimitsFold:
    view = ClusterView()
    fold = UserLimitsFold(view)
    for e in events:
        view.apply(e)
        fold.fold(e)
    return fold


def test_a_replay_of_the_log_reaches_the_same_ledger_and_the_same_verdicts() -> None:
    log = configured()
    live = folded(log)
    script = [("alice", 0.0), ("alice", 0.5), ("bob", 0.6), ("alice", 1.0), ("alice", 2.0), ("alice", 11.0),
              ("alice", 25.0), ("alice", 40.0), ("bob", 41.0)]
    codes = []
    for n, (user, at) in enumerate(script):
        s = submitted(n, user, at)
        verdict = verdict_of(live, s)
        codes.append(verdict.reason.code if isinstance(verdict, ev.JobRejected) else "ADMITTED")
        for e in (s, verdict):
            live.view.apply(e)
            live.fold(e)
            log.append(e)
        if n == 5:  # one of alice's jobs ends
            done = ev.JobCompleted.new(stream=job_stream("j0"), actor="placement", job_id="j0", now=T0)
            live.view.apply(done)
            live.fold(done)
            log.append(done)
    # a burst of 3 per user, a token every 10 s; at most 4 of alice's jobs in `team` at once
    assert codes == ["ADMITTED", "ADMITTED", "ADMITTED", "ADMITTED", "RATE_LIMITED", "ADMITTED",
                     "ADMITTED", "LIMIT_SUBMITTED", "ADMITTED"]
    replayed = folded(log)
    assert replayed.ledger.counts == live.ledger.counts and replayed.ledger.buckets == live.ledger.buckets
    later = submitted(99, "alice", 200.0)
    assert [type(verdict_of(f, later)).__name__ for f in (live, replayed)] == ["JobRejected"] * 2
    assert verdict_of(replayed, later).reason == verdict_of(live, later).reason  # type: ignore[attr-defined]


def test_the_refusals_name_the_limit_the_count_and_when_to_retry() -> None:
    fold = folded(configured())
    for n in range(3):
        s = submitted(n, "alice", n * 0.1)
        for e in (s, verdict_of(fold, s)):
            fold.view.apply(e)
            fold.fold(e)
    limited = verdict_of(fold, submitted(9, "alice", 0.4))
    assert isinstance(limited, ev.JobRejected)
    reason: Reason = limited.reason
    assert reason.code == "RATE_LIMITED" and reason.details["queue"] == "team/a"
    assert 9 < reason.details["retry_after_seconds"] <= 10 and "retry in" in reason.message
    assert reason.details["retry_at"].startswith("2026-12-07T00:00:")
