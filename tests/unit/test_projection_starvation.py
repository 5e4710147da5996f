"""The starvation limit's inputs as the services fold them from the log.

fair-las promotes a waiting job that has waited since it last gave its GPUs back longer than
`starvation_limit` times that run (`core.levels.promote_at`). The services read both from the
projection (`JobView.core_pending`): `requeued_at` is the recorded time of the current attempt's
GangReleased, `last_run_seconds` runs from its JobRunning to that release, so a replay of the log
gives the same values. They are the simulator's for the same history: each requeue the simulator
makes is replayed here as the events the live services record for it, and the folded job is
compared with the PendingJob the simulator made. On the folded view, a round of the services'
steps looks at the promoted job first, and the combined cycle starts it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.contracts import events as ev
from corral.contracts.cluster import parse_cluster_shorthand
from corral.contracts.envelope import Event, Reason, job_stream, node_stream, queue_stream
from corral.contracts.queues import QueueSpec
from corral.core import Cluster, PendingJob, Place, Preempt, QueueConfig, RunningJob, SchedulerConfig, schedule
from corral.core.levels import promote_at
from corral.core.pipeline import run_round
from corral.core.steps import preemption_step
from corral.projection import ClusterView, JobView, core_running
from corral.sim import SimJob, Workload, run_simulation
from corral.sim.api import SimResult
from corral.sim.engine import PIPELINES, Simulator
from corral.sim.records import Interval, JobRecord, RankRecord
from corral.sim.workload import TopologySpec, sim_job
from tests.unit.sim.test_pipeline_agreement import SETTINGS, worlds

FAIR_LAS = SchedulerConfig.named("fair-las")
PREEMPTED = Reason(code="PREEMPTED", message="preempted")


def at(t: float) -> datetime:
    """A simulator time as the log records it."""
    return datetime.fromtimestamp(t, UTC)


@contextmanager
def requeues_of_the_simulator() -> Iterator[list[PendingJob]]:
    """The PendingJob of every requeue the simulator makes (a job that ran and waits again)."""
    seen: list[PendingJob] = []
    add = Simulator._add_pending

    def spy(self: Simulator, pending: PendingJob) -> None:
        if pending.requeued_at is not None:
            seen.append(pending)
        add(self, pending)

    with patch.object(Simulator, "_add_pending", spy):
        yield seen


def simulate(jobs: tuple[SimJob, ...], cluster: Cluster, queues: tuple[QueueConfig, ...],
             pipeline: str) -> tuple[SimResult, list[PendingJob]]:
    with requeues_of_the_simulator() as seen:
        result = run_simulation(Workload(jobs, "drawn"), cluster, policy="fair-las", queues=queues, pipeline=pipeline)
    return result, seen


def job_event(job_id: str, cls: type[Event], t: float, **payload: Any) -> Event:
    return cls.new(stream=job_stream(job_id), actor="test", correlation_id=job_id, job_id=job_id, now=at(t),
                   **payload)


def history(job: SimJob, record: JobRecord, preempted_at: tuple[float, ...], until: float) -> list[Event]:
    """The events the live services record for `job`'s runs that ended by `until`, each at the
    simulator's time: admitted at its submission, each run reserved, placed and running at its
    start, asked to checkpoint at each preemption, released (its GPUs freed at once, as the
    simulator has no processes) and requeued at its end."""
    out = [job_event(job.id, ev.JobSubmitted, job.submit, spec=job.spec),
           job_event(job.id, ev.JobAdmitted, job.submit, queue=job.queue, priority=job.priority,
                     replicas=job.replicas, gpus_per_replica=job.gpus_per_replica)]
    runs = [span for span in record.placements if span.end <= until]
    for attempt, span in enumerate(runs):
        ranks = [ev.RankPlacement(rank=i, node=r.node, gpus=list(r.gpus)) for i, r in enumerate(span.ranks)]
        out += [job_event(job.id, ev.QuotaReserved, span.start, queue=job.queue, gpus=job.gpus),
                job_event(job.id, ev.GangReserved, span.start, ranks=ranks, world_size=len(ranks),
                          master_addr="127.0.0.1", master_port=29500, attempt=attempt),
                job_event(job.id, ev.JobRunning, span.start, attempt=attempt)]
        out += [ev.PreemptRequested.new(stream=job_stream(job.id), actor="preemption", correlation_id=job.id,
                                        victim_job_id=job.id, now=at(t), deadline=at(t) + timedelta(seconds=30),
                                        reason=PREEMPTED)
                for t in preempted_at if span.start <= t <= span.end]
        out.append(job_event(job.id, ev.GangReleased, span.end, reason=PREEMPTED, attempt=attempt))
        out += [ev.GpusReleased.new(stream=node_stream(r.node), actor="placement", correlation_id=job.id,
                                    node=r.node, job_id=job.id, gpus=r.gpus, attempt=attempt, now=at(span.end))
                for r in ranks]
        out += [job_event(job.id, ev.JobRequeued, span.end, reason=PREEMPTED, attempt=attempt + 1),
                job_event(job.id, ev.QuotaReleased, span.end, queue=job.queue, gpus=job.gpus, reason=PREEMPTED)]
    return out


def folded(events: list[Event]) -> ClusterView:
    view = ClusterView()
    for e in events:
        view.apply(e)
    return view


def assert_same_inputs(live: PendingJob, simulated: PendingJob) -> None:
    """The fields the starvation limit and the service levels read (the log keeps microseconds)."""
    close = pytest.approx
    assert live.requeued_at == close(simulated.requeued_at, abs=1e-5)
    assert live.last_run_seconds == close(simulated.last_run_seconds, abs=1e-5)
    assert live.attained_gpu_seconds == close(simulated.attained_gpu_seconds, abs=1e-3)
    assert live.preempted_at == close(simulated.preempted_at, abs=1e-5)
    assert promote_at(live, FAIR_LAS.starvation_limit) == close(
        promote_at(simulated, FAIR_LAS.starvation_limit), abs=1e-3)


def assert_fold_agrees(jobs: tuple[SimJob, ...], result: SimResult, requeues: list[PendingJob]) -> None:
    by_id = {j.id: j for j in jobs}
    records = {r.id: r for r in result.records}
    for simulated in requeues:
        job_id = simulated.job.id
        assert simulated.requeued_at is not None
        events = history(by_id[job_id], records[job_id], simulated.preempted_at, simulated.requeued_at)
        assert_same_inputs(folded(events).jobs[job_id].core_pending(), simulated)


def starving() -> tuple[Cluster, tuple[QueueConfig, ...], tuple[SimJob, ...]]:
    """One 8-GPU node, one queue: a long job runs alone until fresh 8-GPU jobs arrive one every
    900 s (each runs 1000 s); a fresh job preempts it (a level below it) and it waits."""
    node = TopologySpec(replica="node")
    jobs = [sim_job("long", "q", 0.0, 20000.0, 1, 8, topology=node, checkpoint_interval_seconds=600.0)]
    jobs += [sim_job(f"s{i:02d}", "q", 4000.0 + 900.0 * i, 1000.0, 1, 8, topology=node,
                     checkpoint_interval_seconds=600.0) for i in range(30)]
    return Cluster.uniform(1, 8, "H100"), (QueueConfig("q", 8),), tuple(jobs)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_starved_jobs_requeue_folds_to_the_simulators_pending_job(pipeline: str) -> None:
    cluster, queues, jobs = starving()
    result, requeues = simulate(jobs, cluster, queues, pipeline)
    assert [p.job.id for p in requeues][:1] == ["long"]
    first = requeues[0]
    assert first.last_run_seconds > 0 and first.requeued_at == first.last_run_seconds  # it ran from t=0
    assert_fold_agrees(jobs, result, requeues)


@SETTINGS
@given(world=worlds(), pipeline=st.sampled_from(PIPELINES))
def test_every_requeue_of_the_simulator_folds_to_its_pending_job(world, pipeline) -> None:  # type: ignore[no-untyped-def]
    cluster, queues, jobs = world
    result, requeues = simulate(jobs, cluster, queues, pipeline)
    assert_fold_agrees(jobs, result, requeues)


def waiting_after_a_run() -> ClusterView:
    """The live view of the starving case at the long job's requeue: it ran 0-4030 s on the one
    node and waits again; a fresh job of its queue waits too."""
    _, _, jobs = starving()
    inv = parse_cluster_shorthand("1x8:H100").inventories()[0]
    view = ClusterView()
    view.apply(ev.NodeRegistered.new(stream=node_stream(inv.node), actor="agent", node=inv.node, gpus=inv.gpus,
                                     nvlink_domains=inv.nvlink_domains, rack=inv.rack, zone=inv.zone, now=at(0.0)))
    view.apply(ev.QueueConfigured.new(stream=queue_stream("q"), actor="admin",
                                      queue=QueueSpec(name="q", guaranteed_gpus=8), now=at(0.0)))
    long, fresh = jobs[0], jobs[1]
    record = JobRecord(long.id, long.queue, long.gpus, long.replicas, long.gpus_per_replica, long.priority,
                       long.submit, long.duration, {})
    record.placements.append(Interval(0.0, 4030.0, (RankRecord(inv.node, tuple(range(8))),)))
    for e in history(long, record, (4000.0,), 4030.0):
        view.apply(e)
    for e in (job_event(fresh.id, ev.JobSubmitted, fresh.submit, spec=fresh.spec),
              job_event(fresh.id, ev.JobAdmitted, fresh.submit, queue=fresh.queue, priority=fresh.priority,
                        replicas=fresh.replicas, gpus_per_replica=fresh.gpus_per_replica)):
        view.apply(e)
    return view


def first_considered(view: ClusterView, now: float, config: SchedulerConfig = FAIR_LAS) -> str:
    """The job a round of the services' steps looks at first at `now`: quota's first decision."""
    return run_round(view.snapshot(now), config).quota[0].job_id


def test_the_live_view_promotes_a_job_waiting_past_the_limit() -> None:
    view = waiting_after_a_run()
    long: JobView = view.jobs["long"]
    pending = long.core_pending()
    assert (pending.requeued_at, pending.last_run_seconds) == (4030.0, 4030.0)
    promoted = promote_at(pending, FAIR_LAS.starvation_limit)
    assert promoted == 4030.0 + 4 * 4030.0
    leads = dataclasses.replace(FAIR_LAS, promotion_arrives=False)  # a promoted job ahead of every level
    assert first_considered(view, promoted - 1.0, leads) == "s00", "before the limit the fresh job (lower level) leads"
    assert first_considered(view, promoted, leads) == "long", "past it the starved job leads its queue"
    assert first_considered(view, promoted) == "s00", "fair-las: it joins level 0 at its promotion, behind s00"
    placed = [d.job_id for d in schedule(view.snapshot(promoted), leads) if isinstance(d, Place)]
    assert placed == ["long"], "the combined cycle on the live view starts it"


def test_a_release_of_an_attempt_that_never_ran_moves_the_wait_and_keeps_the_last_run() -> None:
    """An attempt released before JobRunning held GPUs but ran nothing: the job's wait starts
    again at its release, and its last run is still the one before."""
    view = waiting_after_a_run()
    before = view.jobs["long"].core_pending()
    inv = parse_cluster_shorthand("1x8:H100").inventories()[0]
    rank = ev.RankPlacement(rank=0, node=inv.node, gpus=list(range(8)))
    for e in (job_event("long", ev.GangReserved, 5000.0, ranks=[rank], world_size=1, master_addr="127.0.0.1",
                        master_port=29500, attempt=1),
              job_event("long", ev.GangReleased, 5100.0, reason=Reason(code="NODE_LOST", message="lost"),
                        attempt=1),
              job_event("long", ev.JobRequeued, 5100.0, reason=Reason(code="NODE_LOST", message="lost"),
                        attempt=2)):
        view.apply(e)
    after = view.jobs["long"].core_pending()
    assert after is not before
    assert (after.requeued_at, after.last_run_seconds) == (5100.0, 4030.0)
    assert after.attained_gpu_seconds == before.attained_gpu_seconds


@contextmanager
def starts_of_the_simulator() -> Iterator[list[RunningJob]]:
    """The RunningJob of every start the simulator makes, as it starts it."""
    seen: list[RunningJob] = []
    add = Simulator._add_running

    def spy(self: Simulator, r: RunningJob) -> None:
        seen.append(r)
        add(self, r)

    with patch.object(Simulator, "_add_running", spy):
        yield seen


def started(job: SimJob, record: JobRecord, r: RunningJob) -> list[Event]:
    """The events the live services record up to `r`'s start: its earlier runs (`history`), then
    this attempt reserved, placed and running at the simulator's start time."""
    out = history(job, record, r.preempted_at, r.start_time)
    attempt = sum(1 for span in record.placements if span.end <= r.start_time)
    ranks = [ev.RankPlacement(rank=rank.rank, node=rank.node, gpus=list(rank.gpus)) for rank in r.placement.ranks]
    return [*out, job_event(job.id, ev.QuotaReserved, r.start_time, queue=job.queue, gpus=job.gpus),
            job_event(job.id, ev.GangReserved, r.start_time, ranks=ranks, world_size=len(ranks),
                      master_addr="127.0.0.1", master_port=29500, attempt=attempt),
            job_event(job.id, ev.JobRunning, r.start_time, attempt=attempt)]


def assert_starts_agree(jobs: tuple[SimJob, ...], pipeline: str, cluster: Cluster,
                        queues: tuple[QueueConfig, ...]) -> list[RunningJob]:
    """Every start of a fair-las replay, folded from its events, is the simulator's running job as
    the promotion reads it (`RunningJob.promoted_service`); returns the simulator's starts."""
    with starts_of_the_simulator() as starts:
        result, _ = simulate(jobs, cluster, queues, pipeline)
    by_id, records = {j.id: j for j in jobs}, {r.id: r for r in result.records}
    for simulated in starts:
        job_id = simulated.job.id
        live = core_running(folded(started(by_id[job_id], records[job_id], simulated)).jobs[job_id], FAIR_LAS)
        assert live.start_time == pytest.approx(simulated.start_time, abs=1e-5)
        assert live.attained_gpu_seconds == pytest.approx(simulated.attained_gpu_seconds, abs=1e-3)
        if simulated.promoted_service is None:
            assert live.promoted_service is None, job_id
        else:
            assert live.promoted_service == pytest.approx(simulated.promoted_service, abs=1e-3), job_id
    return starts


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_promoted_start_folds_to_the_simulators_running_job(pipeline: str) -> None:
    """The starved long job is promoted and started again: the live services' view of it running
    carries its promotion, so it is no level victim of the fresh jobs at once."""
    cluster, queues, jobs = starving()
    starts = assert_starts_agree(jobs, pipeline, cluster, queues)
    promoted = [r for r in starts if r.promoted_service is not None]
    assert [r.job.id for r in promoted][:1] == ["long"]


@SETTINGS
@given(world=worlds(), pipeline=st.sampled_from(PIPELINES))
def test_every_start_of_the_simulator_folds_to_its_running_job(world, pipeline) -> None:  # type: ignore[no-untyped-def]
    cluster, queues, jobs = world
    assert_starts_agree(jobs, pipeline, cluster, queues)


def test_the_live_view_spares_a_promoted_job_it_started() -> None:
    """The long job, promoted, reserved and running again on the live view while a fresh job
    (a level below its whole service) waits: no level preemption of it until it has run a level's
    service since its promotion (`levels.running_level`)."""
    view = waiting_after_a_run()
    promoted = promote_at(view.jobs["long"].core_pending(), FAIR_LAS.starvation_limit)
    rank = ev.RankPlacement(rank=0, node=sorted(view.nodes)[0], gpus=list(range(8)))
    for e in (job_event("long", ev.QuotaReserved, promoted, queue="q", gpus=8),
              job_event("long", ev.GangReserved, promoted, ranks=[rank], world_size=1, master_addr="127.0.0.1",
                        master_port=29500, attempt=1),
              job_event("long", ev.JobRunning, promoted, attempt=1)):
        view.apply(e)
    running = core_running(view.jobs["long"], FAIR_LAS)
    assert running.promoted_service == pytest.approx(4030.0 * 8)
    later = promoted + 60.0
    snapshot = view.snapshot(later, config=FAIR_LAS)
    assert not [d for d in preemption_step(snapshot, FAIR_LAS) if isinstance(d, Preempt)]
    assert core_running(view.jobs["long"]).promoted_service is None, "a view without a policy knows no promotion"
