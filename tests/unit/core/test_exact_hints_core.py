"""The unblock hint is exact: its events, applied and the cycle rerun, place the job.

Minimal, as docs/architecture.md defines it: applying every event of the hint places the job;
leaving out any one does not; a hint of several events means no single candidate event (of the
first `SINGLES`) would do. Checked for random clusters, queues, running and waiting jobs.
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import (
    Cluster,
    Gpu,
    Job,
    Node,
    NodeState,
    QueueConfig,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    Topology,
    TopologyLevel,
)
from corral.core.hints import SINGLES, HintKind, _candidates, describe, unblock
from corral.core.whatif import JobEnds, Rerun
from tests.unit.core.builders import job, running, snapshot


@st.composite
def worlds(draw: st.DrawFn) -> tuple[Snapshot, SchedulerConfig]:
    per_node = draw(st.sampled_from([2, 4]))
    n_nodes = draw(st.integers(1, 4))
    lost = draw(st.sets(st.integers(0, n_nodes - 1), max_size=1)) if n_nodes > 1 else set()
    # a GPU out of service (unhealthy, drained) here and there: its coming back is an event too
    out = [draw(st.sets(st.integers(0, per_node - 1), max_size=1)) for _ in range(n_nodes)]
    nodes = tuple(Node(f"n{i}", tuple(Gpu(g, "H100", 80) for g in range(per_node)), f"r{i // 2}", "z",
                       NodeState.LOST if i in lost else NodeState.READY, out_of_service=frozenset(out[i]))
                  for i in range(n_nodes))
    cluster = Cluster(nodes)
    queues = [QueueConfig("a", draw(st.integers(0, 4)), draw(st.sampled_from([None, 6, 8]))),
              QueueConfig("b", draw(st.integers(0, 4)))]
    queues = [q if q.max_gpus is None or q.max_gpus >= q.guaranteed_gpus else QueueConfig(q.name, q.guaranteed_gpus)
              for q in queues]
    run: list[RunningJob] = []
    for i, node in enumerate(nodes):
        if i in lost:
            continue
        free = list(range(per_node))
        while free and draw(st.integers(0, 4)) > 0:  # mostly full: a waiting job needs events
            take = draw(st.integers(1, len(free)))
            gpus, free = tuple(free[:take]), free[take:]
            est = draw(st.sampled_from([None, 100.0, 300.0, 600.0, 900.0]))
            j = job(f"run{len(run)}", 1, take, queue=draw(st.sampled_from("ab")), preemptible=draw(st.booleans()),
                    estimated_runtime_seconds=est)
            run.append(running(j, [(node.name, gpus)], start=draw(st.sampled_from([0.0, 500.0]))))
    pending: list[Job] = []
    for i in range(draw(st.integers(1, 3))):
        gang = draw(st.sampled_from([None, TopologyLevel.NODE, TopologyLevel.RACK]))
        replicas = draw(st.integers(1, 2))
        pending.append(job(f"p{i}", replicas, draw(st.integers(1, per_node)), queue=draw(st.sampled_from("ab")),
                           submit_time=float(i), priority=draw(st.sampled_from([0, 0, 10])),
                           topology=Topology(gang=gang)))
    policy = draw(st.sampled_from(["corral", "backfill", "corral-no-preemption", "fair-las"]))
    config = (SchedulerConfig(preemption=False, reclaim=False) if policy == "corral-no-preemption"
              else SchedulerConfig.named(policy))
    if policy == "fair-las":  # service levels the running jobs of these snapshots reach
        config = dataclasses.replace(config, las_thresholds=(400.0, 4000.0))
    return snapshot(cluster, pending, run, queues=queues), config


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_the_hints_events_place_the_job_and_none_can_be_left_out(world: tuple[Snapshot, SchedulerConfig]) -> None:
    snap, config = world
    for p in snap.pending:
        hint = unblock(snap, p.job.id, config)
        run = Rerun(snap, config)
        assert describe(hint, snap.now)
        if hint.kind is HintKind.FITS_NOW:
            assert run.places(p.job.id)
        if hint.kind in (HintKind.NEVER, HintKind.BEHIND):  # not even with every event
            assert not run.places(p.job.id, _candidates(snap, config, p.job))
            assert (hint.kind is HintKind.BEHIND) == bool(hint.takers)
        if hint.kind is not HintKind.EVENTS:
            continue
        events = list(hint.events)
        assert events and not run.places(p.job.id)
        assert run.places(p.job.id, events), hint
        for e in events:
            assert not run.places(p.job.id, [x for x in events if x is not e]), (e, hint)
        if len(events) > 1 and hint.exhaustive:
            for c in _candidates(snap, config, p.job)[:SINGLES]:
                assert not run.places(p.job.id, [c]), (c, hint)
        for t in hint.takers:  # a job ahead of it, started on what the events free
            assert run.places(t.job_id, events) or t.job_id in {d.job_id for d in run.actions(events)}


def test_fair_share_the_job_ahead_takes_the_first_gpu_and_both_ends_are_named() -> None:
    cluster = Cluster.uniform(1, 4, "H100")
    queues = [QueueConfig("team-a", 4), QueueConfig("team-b", 4)]
    j = running(job("j", queue="team-a", estimated_runtime_seconds=300.0), [("n000", (0,))])
    rs = [running(job(f"r{i}", queue="team-b", estimated_runtime_seconds=400.0 + 100 * i), [("n000", (1 + i,))])
          for i in range(3)]
    snap = snapshot(cluster, [job("k", queue="team-a", submit_time=1.0), job("p", queue="team-b", submit_time=2.0)],
                    [j, *rs], queues=queues, now=100.0)
    hint = unblock(snap, "p")
    assert hint.kind is HintKind.EVENTS
    assert [e.job_id for e in hint.events if isinstance(e, JobEnds)] == ["j", "r0"]
    assert [(t.job_id, t.queue) for t in hint.takers] == [("k", "team-a")]
    assert hint.standing[0].queue == "team-b" and hint.standing[0].used == 3
    from corral.core import Pending, schedule

    (why,) = [d.reason for d in schedule(snap) if isinstance(d, Pending) and d.job_id == "p"]
    assert why.message.endswith("; queue team-b uses 3 of 4 guaranteed GPUs (under its guarantee)"), why


def test_lost_work_counts_from_the_last_checkpoint_and_a_victim_is_asked_to_write_one() -> None:
    """A victim may checkpoint at the signal, so the preemption reason does not call its work since
    the last checkpoint lost: the work is lost only if it stops without one."""
    cluster = Cluster.uniform(1, 2, "H100")
    low = job("low", gpus=2, priority=0, checkpoint_grace_seconds=30)
    fresh = running(low, [("n000", (0, 1))], start=0.0, checkpoint=995.0)  # checkpointed 5 s ago
    snap = snapshot(cluster, [job("hi", gpus=2, priority=10)], [fresh], now=1000.0)
    from corral.core import Preempt, schedule

    (d,) = [d for d in schedule(snap) if isinstance(d, Preempt)]
    assert "10 GPU-seconds since their last checkpoint are lost only if they stop without checkpointing" in \
        d.reason.message and "within 30 s" in d.reason.message, d.reason.message
    assert d.reason.detail("unsaved_gpu_seconds") == 10.0
    stubborn = running(job("low", gpus=2, priority=0, checkpoint_grace_seconds=0), [("n000", (0, 1))], start=0.0)
    (d,) = [d for d in schedule(snapshot(cluster, [job("hi", gpus=2, priority=10)], [stubborn], now=1000.0))
            if isinstance(d, Preempt)]
    assert "2000 GPU-seconds since their last checkpoint are lost (no checkpoint grace)" in d.reason.message
