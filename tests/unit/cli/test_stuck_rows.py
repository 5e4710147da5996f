"""`corral jobs --stuck`'s rows from a folded log: waits past max_wait (the queue's or a parent's),
escalated or not yet, with how long past it and the blocker they wait with now."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from corral.cli.present import stuck_rows, stuck_table_row
from corral.contracts import events as ev
from corral.contracts.envelope import Reason, job_stream
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.queues import QueueSpec
from corral.projection import ClusterView

T0 = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)


def waiting(view: ClusterView, job_id: str, queue: str, at: float) -> None:
    spec = validate_job_spec({"name": job_id, "queue": queue, "replicas": 1, "gpus_per_replica": 8,
                              "runtime": "sim", "duration_seconds": 5})
    now = T0 + timedelta(seconds=at)
    for cls, payload in ((ev.JobSubmitted, {"spec": spec}),
                         (ev.JobAdmitted, {"queue": queue, "priority": 500, "replicas": 1, "gpus_per_replica": 8}),
                         (ev.PlacementPending, {"reason": Reason(code="GANG_DOES_NOT_FIT", message="0 free")})):
        view.apply(cls.new(stream=job_stream(job_id), actor="t", correlation_id=job_id, job_id=job_id, now=now,
                           **payload))


def test_stuck_rows_list_waits_past_max_wait_with_their_blocker() -> None:
    view = ClusterView()
    for q in (QueueSpec(name="research", max_wait=60.0), QueueSpec(name="research/nlp"),
              QueueSpec(name="prod", max_wait=3600.0)):
        view.apply(ev.QueueConfigured.new(stream=f"queue-{q.name}", actor="t", queue=q, now=T0))
    waiting(view, "late", "research/nlp", at=0)
    waiting(view, "fresh", "research/nlp", at=100)
    waiting(view, "prod-job", "prod", at=0)
    view.apply(ev.WaitExceeded.new(
        stream=job_stream("late"), actor="quota", correlation_id="late", job_id="late", queue="research/nlp",
        limit_queue="research", attempt=0, waiting_since=T0, max_wait_seconds=60.0, waited_seconds=61.0,
        blocker=Reason(code="GANG_DOES_NOT_FIT", message="0 free"), now=T0 + timedelta(seconds=61)))
    now = T0 + timedelta(seconds=130)
    rows = stuck_rows(view, now.timestamp())
    # `fresh` has waited 30 s of its 60, `prod-job` 130 s of its hour
    assert [(r["id"], r["limit_queue"], r["past_seconds"], r["blocker_code"]) for r in rows] == \
           [("late", "research", 70.0, "GANG_DOES_NOT_FIT")]
    assert rows[0]["escalated_at"] == (T0 + timedelta(seconds=61)).isoformat()
    # later, `fresh` is past its limit too, not escalated yet (quota has not looked): listed as such
    rows = stuck_rows(view, (T0 + timedelta(seconds=170)).timestamp())
    assert [(r["id"], r["escalated_at"] is None) for r in rows] == [("late", False), ("fresh", True)]
    table = stuck_table_row(rows[1], T0 + timedelta(seconds=170))
    assert table == ["fresh", "research/nlp", 8, "70s", "60s (research)", "10s", "not yet", "GANG_DOES_NOT_FIT: 0 free"]
