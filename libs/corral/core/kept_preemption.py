"""The preemption step of a quota round's play-out, from scheduling state kept between asks.

Why: quota plays each round out (`corral.core.reservation`): placement, then the preemption step
(`steps.preemption_step`, a whole cycle over every waiting job) on the state where the round's
placements run, and plays it again after each job it refuses. From a snapshot, each play derives
the cycle's input again (`prepared.prepare`: a class per waiting job, the fair-share order, the
classes' counts): with thousands waiting behind full cohorts (Kueue's shape) that is most of a
round, for a state that differs from the last play's by a few jobs. `KeptPreemption` keeps a
`SchedulerState` in step with the snapshots it is asked about (moved by the jobs that came, went
or changed; nothing when the caller passes the same tuples of jobs again), applies a play's
placements to it, runs the cycle from the kept parts and takes the placements back. The cycle
decides the same on any order of the same jobs (tests/unit/core/test_core_properties.py), so
`decide` answers what `preemption_step(after_placing(snapshot, placed, config), config)` answers
(property test: tests/unit/core/test_kept_preemption.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import attrgetter

from corral.core.decisions import Preempt
from corral.core.levels import started_promotion
from corral.core.model import PendingJob, Placement, RunningJob, SchedulerConfig, Snapshot
from corral.core.state import SchedulerState

_JOB_ID = attrgetter("job.id")


def started_job(p: PendingJob, placement: Placement, now: float, config: SchedulerConfig) -> RunningJob:
    """`p` running on `placement` from `now` (a promoted job runs with its promotion,
    `levels.started_promotion`)."""
    return RunningJob(p.job, placement, now, attained_gpu_seconds=p.attained_gpu_seconds, preempted_by=p.preempted_by,
                      preempted_at=p.preempted_at, promoted_service=started_promotion(p, config, now))


class KeptPreemption:
    """The preemption step on a snapshot with a play's placements, from a kept `SchedulerState`."""

    __slots__ = ("_objects", "_pending", "_running", "_state")

    def __init__(self) -> None:
        self._state: SchedulerState | None = None
        # the snapshot's tuples the state was last moved to (the same tuples again: nothing to move)
        self._pending: tuple[PendingJob, ...] | None = None
        self._running: tuple[RunningJob, ...] | None = None
        self._objects: dict[int, PendingJob] = {}  # the state's waiting jobs by object identity

    def decide(self, snapshot: Snapshot, config: SchedulerConfig, placed: Mapping[str, Placement]) -> list[Preempt]:
        """`preemption_step(after_placing(snapshot, placed, config), config)`."""
        try:
            state = self._moved_to(snapshot, config)
            started: list[PendingJob] = []
            for job_id, placement in placed.items():
                p = state.remove_pending(job_id)
                started.append(p)
                state.add_running(started_job(p, placement, snapshot.now, config))
            out = [d for d in state.cycle(snapshot.now) if isinstance(d, Preempt)]
            for p in reversed(started):
                state.remove_running(p.job.id)
                state.add_pending(p)
            return out
        except BaseException:
            self._state = None  # moved part way: built again at the next ask
            raise

    def _moved_to(self, snapshot: Snapshot, config: SchedulerConfig) -> SchedulerState:
        """The kept state with exactly `snapshot`'s jobs, cluster and queues."""
        state = self._state
        if state is None or state.config != config or state.queues != tuple(snapshot.queues):
            state = self._state = SchedulerState(snapshot.cluster, snapshot.queues, config)
            self._pending = self._running = None
            self._objects = {}
        same_pending = snapshot.pending is self._pending
        same_running = snapshot.running is self._running
        came: list[PendingJob] = []
        if not same_pending:  # by object identity, in C: thousands wait, a few came or went
            kept, now = self._objects, dict(zip(map(id, snapshot.pending), snapshot.pending, strict=True))
            if len(now) != len(snapshot.pending):
                raise ValueError("Snapshot: a waiting job is listed twice; job ids must be unique")
            for p in sorted((kept[k] for k in kept.keys() - now.keys()), key=_JOB_ID):
                state.remove_pending(p.job.id)
            came = sorted((now[k] for k in now.keys() - kept.keys()), key=_JOB_ID)
            self._objects = now
        if not same_running:
            self._move_running(state, {r.job.id: r for r in snapshot.running})
        if snapshot.cluster is not state.cluster and snapshot.cluster != state.cluster:
            state.set_cluster(snapshot.cluster)
        if not same_running:
            running = state.running
            for r in snapshot.running:
                if r.job.id not in running:
                    state.add_running(r)
        for p in came:
            state.add_pending(p)
        self._pending, self._running = snapshot.pending, snapshot.running
        return state

    @staticmethod
    def _move_running(state: SchedulerState, now: Mapping[str, RunningJob]) -> None:
        """Take out the running jobs that left; a job still running on the same GPUs with new facts
        is replaced (a checkpoint, asked to checkpoint), one moved or changed otherwise taken out."""
        for job_id, r in list(state.running.items()):
            new = now.get(job_id)
            if new is r:
                continue
            if new is not None and new.job == r.job and new.placement == r.placement:
                state.replace_running(new)
            else:
                state.remove_running(job_id)
