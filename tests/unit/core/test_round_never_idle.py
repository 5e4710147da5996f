"""The services' round never leaves an empty cluster idle while a job that fits it waits.

Why: the quota step plays each reservation out (`corral.core.reservation`) and refuses one that a
waiting job would take back at once. Were two rules to disagree (say LAS taking a job of higher
priority of its queue, which priority takes back), those refusals would form a ring with nothing
behind it: each job refused for the other, and on a cluster where nothing runs and no quota is
held the GPUs idle, round after round (no event comes to change the state). Property: on an
empty cluster (nothing running, no quota held) with waiting jobs that each fit it and their
queue's ceiling, under every named policy, the round reserves at least one job and placement
starts it.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import Cluster, PendingJob, QueueConfig, SchedulerConfig, Snapshot
from corral.core.model import POLICIES
from corral.core.pipeline import run_round
from tests.unit.core.builders import job


@st.composite
def idle_clusters(draw: st.DrawFn) -> Snapshot:
    """An empty cluster of 1-3 nodes of 8 GPUs, 1-3 queues with equal guarantees (some with a
    ceiling no smaller than 8) and 1-12 waiting jobs, each fitting the empty cluster and its
    queue's ceiling, with priorities and attained service of a few hours."""
    nodes = draw(st.integers(1, 2))
    cluster = Cluster.uniform(nodes, 8, "H100")
    names = [f"q{i}" for i in range(draw(st.integers(1, 2)))]
    share = nodes * 8 // len(names)
    queues = tuple(QueueConfig(q, share, max_gpus=draw(st.sampled_from([None, max(8, share)]))) for q in names)
    ceiling = {q.name: q.max_gpus for q in queues}
    pending = []
    for i in range(draw(st.integers(1, 4))):
        queue = draw(st.sampled_from(names))
        per = draw(st.sampled_from([2, 4, 8]))
        replicas = draw(st.integers(1, nodes)) if per == 8 else 1
        limit = ceiling[queue]
        if limit is not None and replicas * per > limit:
            replicas = 1
        j = job(f"j{i}", replicas, per, queue, priority=draw(st.sampled_from([0, 100])),
                preemptible=draw(st.sampled_from([True] * 5 + [False])), submit_time=float(i))
        attained = draw(st.sampled_from([0.0, 600.0, 8000.0]))
        pending.append(PendingJob(j, attained_gpu_seconds=attained))
    return Snapshot(1000.0, cluster, queues, tuple(pending), ())


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshot=idle_clusters())
def test_a_round_on_an_empty_cluster_starts_a_job(snapshot: Snapshot, policy: str) -> None:
    done = run_round(snapshot, SchedulerConfig.named(policy))
    assert done.reserved and done.placed, [(d.job_id, getattr(d, "reason", None)) for d in done.quota]


def test_priority_and_las_agree_on_who_starts() -> None:
    """Under LAS: `fresh` (no service) would take `served` (over an hour more) were `served` not
    of `fresh`'s queue and a higher priority; as it is, LAS spares it (`eligibility.victim_kind`),
    so the play-out refuses neither for the other: `served`, ahead for its priority, starts."""
    served = PendingJob(job("served", 1, 8, "q", priority=100, preemptible=True), attained_gpu_seconds=8000.0)
    fresh = PendingJob(job("fresh", 1, 8, "q", preemptible=True, submit_time=1.0))
    snap = Snapshot(1000.0, Cluster.uniform(1, 8, "H100"), (QueueConfig("q", 8),), (served, fresh), ())
    done = run_round(snap, SchedulerConfig.named("las"))
    assert [d.job_id for d in done.placed] == ["served"]
