"""Quota's round inputs kept between rounds equal the pass over every active job they replaced.

The problem (services/quota/round_inputs.py): each round walked every active job and built the
core's snapshot of the waiting ones, ~27 ms on the event loop with ~13,700 waiting. Now the index
is updated for the job of each folded event. Here any interleaving of jobs' lifecycles (in and out
of order) is folded as the service folds it, and after every event the index must say what the
whole pass says: who waits, which of them hold quota, what is still held, the snapshot's
pending jobs in the same order, as the same objects, what the core's round derives from them
(`core.backlog`), and its running jobs, equal.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.contracts import events as ev
from corral.contracts.envelope import Reason
from corral.contracts.jobspec import validate_job_spec
from corral.core import Cluster, Snapshot
from corral.core.backlog import Backlog
from corral.projection import JobState, JobView, core_running
from corral.services.quota.round_inputs import Kind, classify
from corral.services.quota.service import Quota
from tests.unit.core.test_backlog_kept import same_backlog

T0 = datetime(2026, 12, 5, tzinfo=UTC)
R = Reason(code="TEST", message="test")
OPS = ("reserve", "give_back", "place", "running", "release", "gpus_released", "requeue", "complete",
       "cancel", "fail", "preempt", "reason", "submit")  # a JobSubmitted again: a new spec object


def whole_pass(active: list[JobView]) -> tuple[list[str], set[str], Counter[tuple[str, int]], bool]:
    """The round's inputs as the pass over every active job computed them."""
    pending: list[str] = []
    reserved: set[str] = set()
    held: Counter[tuple[str, int]] = Counter()
    unreserved = False
    for j in active:
        if j.state is JobState.PENDING and j.spec is not None:
            if not j.quota_gpus:
                unreserved = True
            elif j.quota_stale:
                if not j.holding:
                    held[(j.queue, j.quota_gpus)] += 1
                continue
            else:
                reserved.add(j.job_id)
            pending.append(j.job_id)
        elif j.quota_gpus and not j.holding and (j.state is not JobState.PENDING or j.quota_stale):
            held[(j.queue, j.quota_gpus)] += 1
    return sorted(pending), reserved, held, unreserved


def event(op: str, job: str, view: JobView | None, at: datetime) -> Any:
    attempt = view.attempt if view is not None else 0
    base = {"stream": f"job-{job}", "actor": "test", "correlation_id": job, "now": at}
    gpus = 2
    if op == "submit":
        spec = validate_job_spec({"name": job, "queue": "a", "replicas": 1, "gpus_per_replica": gpus,
                                  "runtime": "sim", "duration_seconds": 1})
        return ev.JobSubmitted.new(**base, job_id=job, spec=spec, user="u")
    if op == "admit":
        return ev.JobAdmitted.new(**base, job_id=job, queue="a", priority=0, replicas=1, gpus_per_replica=gpus)
    if op == "reserve":
        return ev.QuotaReserved.new(**base, job_id=job, queue="a", gpus=gpus, borrowed=0)
    if op == "give_back":
        return ev.QuotaReleased.new(**base, job_id=job, queue="a", gpus=gpus, reason=R)
    if op == "place":
        return ev.GangReserved.new(**base, job_id=job, attempt=attempt, world_size=1, master_addr="h",
                                   master_port=20000, ranks=[ev.RankPlacement(rank=0, node="n1", gpus=[0, 1])])
    if op == "running":
        return ev.JobRunning.new(**base, job_id=job, attempt=attempt)
    if op == "release":
        return ev.GangReleased.new(**base, job_id=job, reason=R, attempt=attempt)
    if op == "gpus_released":
        return ev.GpusReleased.new(**base, node="n1", job_id=job, gpus=[0, 1], attempt=attempt)
    if op == "requeue":
        return ev.JobRequeued.new(**base, job_id=job, attempt=attempt + 1, reason=R)
    if op == "complete":
        return ev.JobCompleted.new(**base, job_id=job, attempt=attempt)
    if op == "cancel":
        return ev.JobCancelled.new(**base, job_id=job, reason=R)
    if op == "fail":
        return ev.JobFailed.new(**base, job_id=job, reason=R, attempt=attempt)
    if op == "preempt":
        return ev.PreemptRequested.new(**{**base, "correlation_id": job}, victim_job_id=job, for_job_id="other",
                                       deadline=at + timedelta(seconds=30), reason=R)
    assert op == "reason"
    return ev.PlacementPending.new(**base, job_id=job, reason=R)


lifecycles = st.lists(st.tuples(st.booleans(), st.lists(st.sampled_from(OPS), max_size=10)), min_size=1, max_size=6)


def interleaved(jobs: list[tuple[bool, list[str]]], rng: Any) -> Iterator[tuple[str, str, datetime]]:
    """(op, job, time) of every job's script (admitted, submitted first or not, then its ops), each
    job's ops in its own order, the jobs interleaved at random, a second apart."""
    scripts = [[*(["submit"] if submitted else []), "admit", *ops] for submitted, ops in jobs]
    order = [i for i, script in enumerate(scripts) for _ in script]
    rng.shuffle(order)
    at, next_op = T0, [0] * len(scripts)
    for i in order:
        op = scripts[i][next_op[i]]
        next_op[i] += 1
        at += timedelta(seconds=1)
        yield op, f"j{i}", at


@settings(max_examples=300, deadline=None)
@given(lifecycles, st.randoms(use_true_random=False))
def test_the_kept_inputs_equal_the_whole_pass_after_every_event(jobs: list[tuple[bool, list[str]]],
                                                                 rng: Any) -> None:
    stand_in: Any = object()
    quota = Quota(stand_in, stand_in)
    for op, job, at in interleaved(jobs, rng):
        e = event(op, job, quota.view.jobs.get(job), at)
        if quota.view.apply(e) is not None:  # as Service._fold_stored: the view, then `folded`
            quota.folded(e)
        pending, reserved, held, unreserved = whole_pass(list(quota.view.active.values()))
        kept = quota._inputs
        assert sorted(kept.waiting) == pending, op
        assert kept.reserved == reserved, op
        assert Counter(kept.held()) == held, op
        assert bool(kept.unreserved) == unreserved, op
        # as `ClusterView.snapshot` lists them: sorted by job id, each job's `core_pending()`
        expected = [quota.view.jobs[j].core_pending() for j in pending]
        assert len(kept.core_pending()) == len(expected), op
        assert all(a is b for a, b in zip(kept.core_pending(), expected, strict=True)), op
        # the jobs waiting without quota, grouped by class and the reason their log records
        told: dict[tuple[Any, ...], set[str]] = {}
        for j in pending:
            if j not in reserved:
                core, said = quota.view.jobs[j].core_pending().job, quota.view.jobs[j].reason
                told.setdefault((core.queue, core.total_gpus, core.user, said and said.code,
                                 said and said.message), set()).add(j)
        assert kept.told == told, op
        # what the core's round derives from those pending jobs, kept likewise (`core.backlog`)
        same_backlog(kept.backlog.frozen(), Backlog.of(Snapshot(0.0, Cluster(()), (), kept.core_pending(), ()),
                                                       reserved))
        # the jobs holding GPUs as `ClusterView.snapshot` lists them (a job with no spec has none)
        holding = sorted(quota.view.running_jobs(), key=lambda j: j.job_id)
        if all(j.spec is not None and j.submitted_at is not None for j in holding):
            assert kept.core_running(quota.view, quota.config) == tuple(core_running(j, quota.config)
                                                                        for j in holding), op


def test_every_kind_is_reached() -> None:
    """The property above is not vacuous: each kind of job occurs in a plain lifecycle."""
    stand_in: Any = object()
    quota = Quota(stand_in, stand_in)
    at = T0
    kinds = set()
    for op in ("submit", "admit", "reserve", "place", "running", "release", "complete"):
        at += timedelta(seconds=1)
        e = event(op, "j", quota.view.jobs.get("j"), at)
        quota.view.apply(e)
        quota.folded(e)
        kinds.add(classify(quota.view.jobs["j"]))
    assert kinds == {Kind.WAITING, Kind.RESERVED, Kind.NONE, Kind.HELD}
