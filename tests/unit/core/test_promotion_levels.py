"""With `promotion_resets_level`, a job the starvation limit promoted counts as level 0 for preemption
both ways (`levels`): waiting, it preempts a running job of its queue above level 0; started, it is
no level victim until its service since its promotion (`RunningJob.promoted_service`) reaches the
first threshold."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from corral.core import Cluster, PendingJob, Preempt, QueueConfig, SchedulerConfig, schedule
from corral.core.levels import running_level, started_promotion, waiting_level
from corral.core.preemption import Preemptors

from .builders import job, running, snapshot
from .test_core_properties import SETTINGS as _SETTINGS

SETTINGS = _SETTINGS.__class__(_SETTINGS, max_examples=60)

THRESHOLD = 500.0
QUEUES = [QueueConfig("a", 1)]


def _config(limit: float = 4.0, resets: bool = True) -> SchedulerConfig:
    return dataclasses.replace(SchedulerConfig.named("fair-las"), las_thresholds=(THRESHOLD,), starvation_limit=limit,
                               promotion_resets_level=resets)


def _preempted(decisions: list) -> list[tuple[str, tuple[str, ...]]]:
    return [(d.job_id, d.victims) for d in decisions if isinstance(d, Preempt)]


@SETTINGS
@given(attained=st.floats(THRESHOLD, 5000.0), run=st.floats(1.0, 100.0), early=st.booleans())
def test_a_promoted_job_preempts_a_running_job_of_its_level(attained: float, run: float, early: bool) -> None:
    """1x1, queue a: `busy` (level 1, just checkpointed) runs; `old` (level 1 as well) waits since
    t=1000 after a run of `run` s. Promoted (at 1000 + 4 x run) it preempts `busy`; before, never."""
    config = _config()
    old = PendingJob(job("old", queue="a", submit_time=0.0), attained, requeued_at=1000.0, last_run_seconds=run)
    now = 1000.0 + 4 * run + (-0.5 if early else 0.0)
    busy = running(job("busy", queue="a", submit_time=500.0), [("n000", (0,))], start=0.0, checkpoint=now,
                   attained_gpu_seconds=THRESHOLD)
    snap = snapshot(Cluster.uniform(1, 1, "H100"), [old], [busy], queues=QUEUES, now=now)
    assert waiting_level(old, config, now) == (1 if early else 0)
    assert _preempted(schedule(snap, config)) == ([] if early else [("old", ("busy",))])
    assert Preemptors([old]).may_preempt([busy], now, config) or early
    assert _preempted(schedule(snap, _config(0.0))) == []  # no limit: level 1 against level 1
    assert _preempted(schedule(snap, _config(resets=False))) == []  # promoted in the order only


@SETTINGS
@given(attained=st.floats(0.0, 5000.0), run=st.floats(1.0, 100.0), added=st.floats(0.0, 1000.0),
       waiters=st.integers(1, 3), gpus=st.sampled_from([1, 2]))
def test_a_promoted_job_once_started_is_no_level_victim_before_a_levels_service(
    attained: float, run: float, added: float, waiters: int, gpus: int
) -> None:
    """`old`, promoted and started at t0, runs on a full 1x2 node of its queue; new level-0 jobs wait.
    It is their victim exactly when its service since the start (= since its promotion) reaches
    the threshold, whatever its service before."""
    config = _config()
    t0 = 1000.0 + 4 * run
    old = PendingJob(job("old", gpus=gpus, queue="a", submit_time=0.0), attained, requeued_at=1000.0,
                     last_run_seconds=run)
    assert started_promotion(old, config, t0) == attained
    now = t0 + added / gpus
    started = running(old.job, [("n000", tuple(range(gpus)))], start=t0, checkpoint=now,
                      attained_gpu_seconds=attained, promoted_service=started_promotion(old, config, t0))
    filler = [running(job(f"f{g}", queue="a", submit_time=t0), [("n000", (g,))], start=t0) for g in range(gpus, 2)]
    new = [PendingJob(job(f"new{i}", gpus=gpus, queue="a", submit_time=now)) for i in range(waiters)]
    snap = snapshot(Cluster.uniform(1, 2, "H100"), new, [started, *filler], queues=QUEUES, now=now)
    victims = {v for _, vs in _preempted(schedule(snap, config)) for v in vs}
    crossed = started.attained(now) - attained >= THRESHOLD
    assert running_level(started, config.las_thresholds, now) == (1 if crossed else 0)
    assert ("old" in victims) == crossed
    if crossed:
        assert Preemptors(new).may_preempt(snap.running, now, config)
