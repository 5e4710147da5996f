"""A deciding service's fold forgets jobs that are over and hold nothing (`ClusterView.forget_ended`):
its memory is O(active jobs + nodes) however long the log, and it decides as the whole fold does.

- folding N ended jobs leaves no job in `jobs` (only their ids, in `forgotten`);
- on any log (varied job lives, late events of ended jobs included) the forgetting fold holds
  exactly the whole fold's active jobs, equal field for field, and the same nodes, queues,
  rendezvous ports, waits and core snapshot; folding it twice gives the same view.
"""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.contracts import events as ev
from corral.contracts.envelope import Event, Reason, job_stream
from corral.projection import ClusterView
from tests.unit.readmodel_logs import T0, _life, varied_log

ENDED = ("completed", "failed", "cancelled", "late_exit", "late_cancel")


def fold(events: list[Event], forget: bool) -> ClusterView:
    view = ClusterView(forget_ended=forget)
    for position, event in enumerate(events, 1):
        view.apply(event, None, position)
    return view


def ended_log(jobs: int) -> list[Event]:
    """The nodes and queue of `varied_log`, then `jobs` lives that end, one after another on node-0."""
    events = varied_log(0)
    for i in range(jobs):
        events += _life(f"job-{i:05d}", "node-0", ENDED[i % len(ENDED)], T0 + timedelta(minutes=i))
    return events


def test_a_fold_of_ended_jobs_keeps_none_of_them() -> None:
    for jobs in (10, 1000):
        view = fold(ended_log(jobs), forget=True)
        assert view.jobs == {} and view.active == {} and len(view.forgotten) == jobs
        assert not view.nodes["node-0"].allocations
    assert len(fold(ended_log(1000), forget=False).jobs) == 1000  # the whole fold keeps every one


def test_a_late_event_of_a_forgotten_job_changes_nothing() -> None:
    events = varied_log(30, seed=1)
    view = fold(events, forget=True)
    gone = sorted(view.forgotten)[0]
    before = (dict(view.jobs), {n: v.allocations.copy() for n, v in view.nodes.items()})
    view.apply(ev.WorkerExited.new(stream=job_stream(gone), actor="test", job_id=gone, rank=0, node="node-0",
                                   exit_code=0, reason=Reason(code="EXITED", message="exited"),
                                   now=T0 + timedelta(days=1)))
    view.apply(ev.JobCancelled.new(stream=job_stream(gone), actor="test", job_id=gone,
                                   reason=Reason(code="CANCELLED", message="late"), now=T0 + timedelta(days=1)))
    assert gone not in view.jobs and gone not in view.active
    assert before == (dict(view.jobs), {n: v.allocations.copy() for n, v in view.nodes.items()})


@settings(max_examples=40, deadline=None)
@given(jobs=st.integers(1, 60), seed=st.integers(0, 10_000))
def test_the_forgetting_fold_decides_from_what_the_whole_fold_holds(jobs: int, seed: int) -> None:
    events = varied_log(jobs, seed=seed)
    whole, kept = fold(events, forget=False), fold(events, forget=True)
    assert set(kept.jobs) == set(kept.active) == set(whole.active)
    assert all(kept.jobs[j] == whole.jobs[j] for j in kept.jobs)
    assert kept.forgotten == set(whole.jobs) - set(whole.active)
    assert kept.nodes == whole.nodes and kept.queues == whole.queues and kept.ports == whole.ports
    assert kept.waits() == whole.waits()
    now = (T0 + timedelta(days=2)).timestamp()
    assert kept.snapshot(now) == whole.snapshot(now)
    again = fold(events, forget=True)
    assert again.jobs == kept.jobs and again.forgotten == kept.forgotten
