"""`corral usage`'s figures (corral.accounting) against sums computed here, independently, from
the same job histories: random ones (hypothesis) and a hand-checked one with a window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.accounting import EVENT_TYPES, GroupBy, Window, grouped, job_usage, total
from corral.contracts import events as ev
from corral.contracts.envelope import Event, Reason
from corral.contracts.jobspec import validate_job_spec

T0 = datetime(2026, 12, 1, tzinfo=UTC)
ENDS = {"preempted": "PREEMPTED", "failed": "WORKER_FAILED", "completed": "COMPLETED", "cancelled": "CANCELLED"}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def history(job: str, queue: str, user: str, replicas: int, start: float,
            attempts: list[tuple[float, float, float | None, float, str]]) -> tuple[list[Event], dict[str, float]]:
    """A job's events, and its figures computed the plain way. Each attempt is (wait, run,
    checkpoint after or None, release lag of the GPUs, how it ended)."""
    gpus = replicas * 4
    spec = validate_job_spec({"name": job, "queue": queue, "replicas": replicas, "gpus_per_replica": 4,
                              "runtime": "sim", "duration_seconds": 60})
    common: dict[str, Any] = {"stream": f"job-{job}", "actor": "t", "correlation_id": job, "job_id": job}
    events: list[Event] = [
        ev.JobSubmitted.new(spec=spec, user=user, now=at(start), **common),
        ev.JobAdmitted.new(queue=queue, priority=500, replicas=replicas, gpus_per_replica=4, now=at(start), **common)]
    want = {"used": 0.0, "waited": 0.0, "lost_preemption": 0.0, "lost_failure": 0.0}
    t = start
    for n, (wait, run, checkpoint, lag, end) in enumerate(attempts):
        ranks = [ev.RankPlacement(rank=r, node=f"n{r}", gpus=[0, 1, 2, 3]) for r in range(replicas)]
        events.append(ev.GangReserved.new(ranks=ranks, world_size=replicas, master_addr="127.0.0.1", master_port=29500,
                                          attempt=n, now=at(t + wait), **common))
        if checkpoint is not None:
            events.append(ev.CheckpointDone.new(path="/c", attempt=n, now=at(t + wait + checkpoint), **common))
        released = t + wait + run
        events.append(ev.GangReleased.new(reason=Reason(code=ENDS[end], message=end), attempt=n,
                                          now=at(released), **common))
        for r in range(replicas):
            events.append(ev.GpusReleased.new(node=f"n{r}", gpus=[0, 1, 2, 3], attempt=n, now=at(released + lag),
                                              **{**common, "stream": f"node-n{r}"}))
        want["waited"] += gpus * wait
        want["used"] += gpus * (run + lag)
        lost = gpus * (run - (checkpoint or 0.0))
        want["lost_preemption"] += lost if end == "preempted" else 0.0
        want["lost_failure"] += lost if end == "failed" else 0.0
        t = released
        if n < len(attempts) - 1:
            events.append(ev.JobRequeued.new(reason=Reason(code="PREEMPTED", message="again"), attempt=n + 1,
                                             now=at(t), **common))
    return events, want


attempt = st.tuples(st.integers(0, 500), st.integers(1, 900), st.one_of(st.none(), st.integers(0, 0)),
                    st.integers(0, 5), st.sampled_from(sorted(ENDS))).map(
    lambda a: (float(a[0]), float(a[1]), None if a[2] is None else float(a[1]) / 2, float(a[3]), a[4]))
job = st.tuples(st.sampled_from(["a", "b", "c/x"]), st.sampled_from(["ann", "bob"]), st.integers(1, 2),
                st.integers(0, 1000), st.lists(attempt, min_size=1, max_size=3))


@settings(max_examples=60, deadline=None)
@given(st.lists(job, min_size=1, max_size=6))
def test_usage_totals_equal_the_sum_over_jobs_computed_independently(jobs: list[Any]) -> None:
    events: list[Event] = []
    wanted: dict[str, tuple[str, str, dict[str, float]]] = {}
    for i, (queue, user, replicas, start, attempts) in enumerate(jobs):
        evs, want = history(f"j{i}", queue, user, replicas, start, attempts)
        events += evs
        wanted[f"j{i}"] = (queue, user, want)
    events.sort(key=lambda e: e.occurred_at)  # the log's order, near enough
    assert {e.type for e in events} <= set(EVENT_TYPES)  # what `corral usage` reads of the log
    usages = job_usage(events, Window(until=at(10**6)))
    keys = ("used", "waited", "lost_preemption", "lost_failure")
    for job_id, (_, _, want) in wanted.items():
        got = usages[job_id]
        assert [round(getattr(got, k), 6) for k in keys] == [round(want[k], 6) for k in keys], job_id
    grand = [sum(w[k] for _, _, w in wanted.values()) / 3600 for k in keys]
    for by in GroupBy:
        rows = grouped(usages.values(), by)
        overall = total(rows)
        assert [round(x, 6) for x in (overall.used, overall.waited, overall.lost_preemption, overall.lost_failure)] \
            == [round(x, 6) for x in grand], by
    by_queue = {r.key: r for r in grouped(usages.values(), GroupBy.QUEUE)}
    for queue in {q for q, _, _ in wanted.values()}:
        used = sum(w["used"] for q, _, w in wanted.values() if q == queue) / 3600
        if used:
            assert round(by_queue[queue].used, 6) == round(used, 6)


def test_a_window_counts_only_its_part_and_a_gang_still_running_until_its_end() -> None:
    # j1: admitted at 0, placed at 100 on 8 GPUs, checkpoint at 400, preempted at 700, GPUs free at 710,
    # requeued at 700, placed again at 1000 and still running.
    events, _ = history("j1", "a", "ann", 2, 0, [(100, 600, 300, 10, "preempted")])
    common: dict[str, Any] = {"stream": "job-j1", "actor": "t", "correlation_id": "j1", "job_id": "j1"}
    ranks = [ev.RankPlacement(rank=r, node=f"n{r}", gpus=[0, 1, 2, 3]) for r in range(2)]
    events.append(ev.JobRequeued.new(reason=Reason(code="PREEMPTED", message="p"), attempt=1, now=at(700), **common))
    events.append(ev.GangReserved.new(ranks=ranks, world_size=2, master_addr="h", master_port=29500, attempt=1,
                                      now=at(1000), **common))
    # window [50, 1200): waited 50..100 and 700..1000 (8 GPUs); used 100..710 and 1000..1200; lost 400..700
    u = job_usage(events, Window(since=at(50), until=at(1200)))["j1"]
    assert u.waited == 8 * (50 + 300)
    assert u.used == 8 * (610 + 200)
    assert u.lost_preemption == 8 * 300 and u.lost_failure == 0
    (row,) = grouped([u], GroupBy.USER)
    assert row.key == "ann" and row.jobs == 1 and row.used == 8 * 810 / 3600
    # nothing in the window: no row
    assert grouped(job_usage(events, Window(since=at(5000), until=at(5000))).values(), GroupBy.JOB) == []
