"""The discrete-event engine: a virtual clock driving the same `corral.core.schedule` the services run.

Events are arrivals, completions, releases (a preempted job's checkpoint grace is over and its GPUs
come back), and optional seeded node failures and repairs. All events at one instant are applied
first, then one scheduling cycle runs on the resulting snapshot, and its decisions are applied at
that same instant. A cycle runs only when something changed that could change a decision (a job
arrived, GPUs were freed, a node came or went) and some job is pending.

Preemption model: a victim keeps its GPUs for its checkpoint grace, then releases them. A job
checkpoints by itself every `checkpoint_interval_seconds` of its run; when it is stopped it loses
the work done since its last periodic checkpoint, so it is requeued with its remaining duration
plus that lost work. A victim that would finish within its grace simply finishes.

Why the state is incremental: a Philly replay has ~100,000 cycles with one or two jobs changed
between two of them. The engine keeps pending and running jobs as ready-made core objects, and
tells a `corral.core.state.SchedulerState` every change, so a cycle starts from the free-GPU index,
usage, order and job classes as they stand instead of rebuilding them from a snapshot; the
decisions are exactly those of `schedule(snapshot)` (property-tested). A caller's own `scheduler`
gets the snapshot instead.

Two pipelines (`pipeline=`): "cycle" (the default) runs the single combined cycle, where quota,
placement and preemption are decided for each job together; "services" runs the live services'
round instead (`corral.core.pipeline.run_round`): quota reserves (a job keeps its reservation
while it waits; it is given back when the job stops), placement places jobs holding quota,
preemption acts on the state that leaves; `corral.sim.services` keeps each step's inputs, told
every change as the state is. No cycle is skipped as futile (a reservation may change while no
GPU is free).
tests/unit/sim/test_pipeline_agreement.py states where the two must agree.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from corral import translate
from corral.collector import busy_collection
from corral.contracts.lifecycle import LifecycleCode, WorkerExit
from corral.core import (
    Cluster,
    Decision,
    Job,
    NodeState,
    OrderPolicy,
    Pending,
    PendingJob,
    Place,
    Placement,
    Preempt,
    QueueConfig,
    RunningJob,
    SchedulerConfig,
    Snapshot,
)
from corral.core.levels import started_promotion
from corral.core.protection import times_read
from corral.core.state import SchedulerState
from corral.lifecycle import Gang, GangState, Limits, Release, Then, next_steps
from corral.sim.histories import PreemptionHistory
from corral.sim.records import Interval, JobRecord, RankRecord
from corral.sim.services import ServicesRound
from corral.sim.workload import SimJob, Workload

Scheduler = Callable[[Snapshot, SchedulerConfig], list[Decision]]

#: "cycle": the single combined cycle; "services": quota, placement and preemption one after the other.
PIPELINES = ("cycle", "services")

# Event kinds, in the order they are applied at one instant: GPUs come back before jobs arrive.
_COMPLETE, _RELEASE, _FAIL, _REPAIR = 0, 1, 2, 3


#: The simulator's gangs end only by completing, stopping for a preemption or losing a node: the
#: lifecycle's time bounds (start barrier, heartbeats) never apply to them.
_LIMITS = Limits(start_timeout=math.inf, workers_lost=math.inf, preempt_overrun=math.inf)


class SimulationError(RuntimeError):
    """The core returned a decision that cannot be applied (a bug in the core, never bad input)."""


@dataclass(frozen=True, slots=True)
class FailureModel:
    """Seeded node failures: each node fails after an exponential time with mean `mtbf_hours`,
    stays lost for `repair_hours`, then comes back. Jobs on a failed node lose the work since their
    last checkpoint and are requeued (no grace: the node is gone)."""

    mtbf_hours: float
    repair_hours: float = 4.0


@dataclass(slots=True)
class EngineStats:
    """How the run went mechanically, for benchmarks and profiling."""

    cycles: int = 0
    events: int = 0
    decisions: int = 0
    schedule_seconds: float = 0.0
    wall_seconds: float = 0.0
    max_pending: int = 0
    node_failures: int = 0
    skipped_cycles: int = 0


@dataclass(slots=True)
class _Run:
    """The current run of a running job."""

    epoch: int
    start: float
    ranks: tuple[RankRecord, ...]
    gpus: tuple[tuple[str, int], ...]
    preemptor: str | None = None
    next_checkpoint: float = math.inf


@dataclass(slots=True)
class SimOutcome:
    records: list[JobRecord]
    stats: EngineStats
    final_reasons: dict[str, str] = field(default_factory=dict)


def core_job(job: SimJob, *, by_user: bool = False) -> Job:
    """The job as the policy sees it: its spec at its submit time, never the true duration
    (`corral.translate.job_from_spec`, the services' translation too); its user (the spec's) only
    when a queue limits GPUs per user (`by_user`), the one rule that reads it."""
    return translate.job_from_spec(job.id, job.spec, job.submit, job.spec.user if by_user else None)


def last_periodic_checkpoint(start: float, now: float, interval: float) -> float:
    """The time of the last checkpoint at or before `now` of a run started at `start` that
    checkpoints every `interval` seconds: `last <= now < last + interval`.

    `start + floor((now - start) / interval) * interval` alone falls one period short when the
    subtraction rounds down (start 145.004, now 1045.004: 899.9999999999999 / 60 floors to 14),
    and the next checkpoint would be `now` again, re-queued forever."""
    periods = math.floor((now - start) / interval)
    last = start + periods * interval
    while last + interval <= now:
        periods += 1
        last = start + periods * interval
    while last > now and periods > 0:  # and the quotient rounded up to a whole period not yet reached
        periods -= 1
        last = start + periods * interval
    return last


class Simulator:
    """One replay of a workload under one policy. Use `run()` once."""

    def __init__(
        self,
        workload: Workload,
        cluster: Cluster,
        queues: Sequence[QueueConfig],
        config: SchedulerConfig,
        *,
        seed: int = 0,
        failures: FailureModel | None = None,
        scheduler: Scheduler | None = None,
        progress: Callable[[float, EngineStats], None] | None = None,
        progress_every: int = 5000,
        skip_futile_cycles: bool = True,
        pipeline: str = "cycle",
    ) -> None:
        """`progress(now, stats)` is called every `progress_every` cycles (for long replays);
        `skip_futile_cycles=False` runs every cycle (to prove that skipping changes nothing);
        `pipeline`: one of `PIPELINES` (see the module docstring)."""
        if pipeline not in PIPELINES:
            raise ValueError(f"unknown pipeline {pipeline!r}; choose one of {', '.join(PIPELINES)}")
        if pipeline == "services" and scheduler is not None:
            raise ValueError("pipeline 'services' runs the core's steps; a scheduler of the caller's runs 'cycle'")
        #: services pipeline: its round, told each job that comes to wait or stops waiting
        self._services = ServicesRound(cluster, queues, config) if pipeline == "services" else None
        self._progress = progress
        self._progress_every = progress_every
        self._actions: Scheduler
        # The pending and running jobs live in a SchedulerState. Without a scheduler of the
        # caller's, cycles run on it: the same decisions as `schedule(snapshot)`, without
        # rebuilding per cycle; a caller's scheduler gets `state.snapshot(now)`.
        self._state = SchedulerState(cluster, queues, config)
        self._on_state = scheduler is None
        if scheduler is None:
            from corral.core import schedule as core_schedule

            scheduler = core_schedule
            # the replay applies only actions: the core may skip explaining jobs that stay pending
            self._actions = lambda snapshot, config: core_schedule(snapshot, config, explain=False)
        else:
            self._actions = scheduler
        self._schedule: Scheduler = scheduler
        self._workload = workload
        self._cluster = cluster
        self._queues = tuple(queues)
        self._by_user = any(q.max_gpus_per_user is not None for q in self._queues)
        self._config = config
        self._seed = seed
        self._failures = failures
        self._can_preempt = config.preemption or config.reclaim
        # strict FIFO: only the oldest pending job can start first, so its size alone decides
        self._strict_fifo = config.order is OrderPolicy.FIFO and not config.backfill and not self._can_preempt
        self._fifo_heads: list[tuple[float, str]] = []
        self._skip_futile = skip_futile_cycles and self._services is None
        self._track_checkpoints = self._can_preempt
        self._sim: dict[str, SimJob] = {j.id: j for j in workload.jobs}
        if len(self._sim) != len(workload.jobs):
            raise ValueError("workload job ids must be unique")
        self._records: dict[str, JobRecord] = {
            j.id: JobRecord(
                id=j.id,
                queue=j.queue,
                gpus=j.gpus,
                replicas=j.replicas,
                gpus_per_replica=j.gpus_per_replica,
                priority=j.priority,
                submit=j.submit,
                duration=j.duration,
                topology={"replica": j.topology.replica, "gang": j.topology.gang},
            )
            for j in workload.jobs
        }
        self._remaining: dict[str, float] = {j.id: j.duration for j in workload.jobs}
        self._attained: dict[str, float] = {}
        # what the core reads of each job's preemptions; all of it for a caller's own scheduler
        self._history = PreemptionHistory(times_read(config), full=not self._on_state)
        self._jobs: dict[str, Job] = {}
        # read-only views of the state's jobs: every change goes through the state
        self._pending: Mapping[str, PendingJob] = self._state.pending
        self._running: Mapping[str, RunningJob] = self._state.running
        self._runs: dict[str, _Run] = {}
        self._held: dict[tuple[str, int], str] = {}
        self._held_on: dict[str, int] = {n.name: 0 for n in cluster.nodes}
        self._free_ready = 0
        self._recount_free()
        self._pending_sizes: dict[int, int] = {}
        self._events: list[tuple[float, int, int, str, int]] = []
        self._checkpoints: list[tuple[float, int, str, int]] = []
        self._seq = 0
        self._epoch = 0
        self._started = 0.0
        self.stats = EngineStats()

    # -- public -----------------------------------------------------------------------------
    def run(self) -> SimOutcome:
        with busy_collection():
            return self._run()

    def _run(self) -> SimOutcome:
        wall = self._started = time.perf_counter()
        jobs = self._workload.jobs
        arrival = 0
        if self._failures is not None:
            self._plan_failures(self._failures)
        while arrival < len(jobs) or self._events:
            now = self._events[0][0] if self._events else math.inf
            if arrival < len(jobs) and jobs[arrival].submit <= now:
                now = jobs[arrival].submit
            changed = False
            while self._events and self._events[0][0] <= now:
                _, kind, _, job_id, epoch = heapq.heappop(self._events)
                self.stats.events += 1
                changed |= self._apply_event(now, kind, job_id, epoch)
            while arrival < len(jobs) and jobs[arrival].submit <= now:
                self._arrive(jobs[arrival])
                arrival += 1
                self.stats.events += 1
                changed = True
            if changed and self._pending:
                if self._futile():
                    self.stats.skipped_cycles += 1
                else:
                    self._cycle(now)
        self.stats.wall_seconds = time.perf_counter() - wall
        reasons = self._final_reasons()
        return SimOutcome([self._records[j.id] for j in jobs], self.stats, reasons)

    def _futile(self) -> bool:
        """True when no decision can come out of a cycle: the policy never preempts and no pending
        job is small enough for the free GPUs of ready nodes. Skipping it changes nothing, because
        the core keeps no state between cycles. Under strict FIFO it is enough that the oldest
        pending job is larger than the free GPUs: nothing may start before it."""
        if not self._skip_futile or self._can_preempt:
            return False
        if self._free_ready < min(self._pending_sizes):
            return True
        if self._strict_fifo:
            heads = self._fifo_heads
            while heads[0][1] not in self._pending:
                heapq.heappop(heads)
            return self._free_ready < self._pending[heads[0][1]].job.total_gpus
        return False

    def _recount_free(self) -> None:
        self._free_ready = sum(
            n.gpu_count - self._held_on[n.name] for n in self._cluster.nodes if n.state is NodeState.READY
        )

    def _add_pending(self, pending: PendingJob) -> None:
        self._state.add_pending(pending)
        if self._services is not None:
            self._services.came(pending)
        if self._strict_fifo:
            heapq.heappush(self._fifo_heads, (pending.job.submit_time, pending.job.id))
        size = pending.job.total_gpus
        self._pending_sizes[size] = self._pending_sizes.get(size, 0) + 1

    def _pop_pending(self, job_id: str) -> PendingJob | None:
        pending = self._state.remove_pending(job_id) if job_id in self._pending else None
        if pending is not None:
            if self._services is not None:
                self._services.went(job_id)
            size = pending.job.total_gpus
            left = self._pending_sizes[size] - 1
            if left:
                self._pending_sizes[size] = left
            else:
                del self._pending_sizes[size]
        return pending

    def _add_running(self, r: RunningJob) -> None:
        self._state.add_running(r)
        if self._services is not None:
            self._services.started(r)

    def _replace_running(self, r: RunningJob) -> None:
        self._state.replace_running(r)
        if self._services is not None:
            self._services.changed(r)

    # -- events -----------------------------------------------------------------------------
    def _push(self, at: float, kind: int, job_id: str, epoch: int) -> None:
        self._seq += 1
        heapq.heappush(self._events, (at, kind, self._seq, job_id, epoch))

    def _arrive(self, sim: SimJob) -> None:
        job = core_job(sim, by_user=self._by_user)
        self._jobs[sim.id] = job
        self._add_pending(PendingJob(job))

    def _apply_event(self, now: float, kind: int, job_id: str, epoch: int) -> bool:
        if kind in (_COMPLETE, _RELEASE):
            run = self._runs.get(job_id)
            if run is None or run.epoch != epoch:
                return False
            # every rank exits 0 (completed), or checkpoints and stops (the preemption grace is over)
            self._end(job_id, now, WorkerExit.COMPLETED if kind == _COMPLETE else WorkerExit.CHECKPOINTED)
            return True
        if kind == _FAIL:
            return self._fail_node(now, job_id)
        if kind == _REPAIR:
            self._set_node_state(job_id, NodeState.READY)
            return True
        raise AssertionError(f"unknown event kind {kind}")

    def _end(self, job_id: str, now: float, exit_code: int | None = None, lost_node: str | None = None) -> None:
        """A gang's ranks all exited with `exit_code`, or its node `lost_node` failed: the
        lifecycle's rules (`corral.lifecycle`, as in placement) say how the job goes on. The
        simulator has no processes, so a released gang's GPUs come back at once (no fence)."""
        run, running = self._runs[job_id], self._running[job_id]
        ranks = frozenset(r.rank for r in running.placement.ranks)
        gang = Gang(job_id=job_id, attempt=0, state=GangState.PREEMPTING if running.preempting else GangState.RUNNING,
                    placement=running.placement, placed_at=run.start, started=ranks, running_since=run.start,
                    exits={} if exit_code is None else dict.fromkeys(ranks, exit_code),
                    lost_nodes=frozenset() if lost_node is None else frozenset({lost_node}))
        for step in next_steps(gang, now, _LIMITS):
            if not isinstance(step, Release):
                continue
            if step.then is Then.COMPLETE:
                self._stop(job_id, now, finished=True)
                return
            self._stop(job_id, now, finished=False)  # requeued (by preemption, for PREEMPTED)
            record = self._records[job_id]
            if step.code is LifecycleCode.PREEMPTED:
                record.preemptions += 1
            elif step.code is LifecycleCode.NODE_LOST:
                record.failures += 1
            return
        raise SimulationError(f"job {job_id!r}: the gang lifecycle did not end it at t={now} ({gang.state})")

    def _stop(self, job_id: str, now: float, finished: bool) -> None:
        """The job gives its GPUs back: done, or requeued with the work since its last checkpoint lost."""
        run = self._runs.pop(job_id)
        running = self._state.remove_running(job_id)
        if self._services is not None:
            self._services.stopped(job_id)
        for key in run.gpus:
            del self._held[key]
            self._held_on[key[0]] -= 1
            if self._cluster.node(key[0]).state is NodeState.READY:
                self._free_ready += 1
        record = self._records[job_id]
        record.placements.append(Interval(run.start, now, run.ranks))
        elapsed = now - run.start
        gpus = running.job.total_gpus
        self._attained[job_id] = self._attained.get(job_id, 0.0) + elapsed * gpus
        if finished:
            self._remaining[job_id] = 0.0
            record.end = now
            self._history.finished(job_id)
            return
        sim = self._sim[job_id]
        saved = math.floor(elapsed / sim.checkpoint_interval_seconds) * sim.checkpoint_interval_seconds
        saved = min(saved, self._remaining[job_id])
        self._remaining[job_id] -= saved
        record.lost_gpu_seconds += (elapsed - saved) * gpus
        if run.preemptor is not None:
            self._history.stopped_for(job_id, run.preemptor)
        self._add_pending(PendingJob(running.job, self._attained[job_id], self._history.by(job_id),
                                     self._history.at(job_id), now, elapsed))

    # -- one cycle ------------------------------------------------------------------------------
    def _cycle(self, now: float) -> None:
        if self._track_checkpoints:
            self._advance_checkpoints(now)
        self.stats.max_pending = max(self.stats.max_pending, len(self._pending))
        started = time.perf_counter()
        if self._services is not None:
            decisions = self._services.run(now, self._state)
        elif self._on_state:
            decisions = self._state.cycle(now)
        else:
            decisions = self._actions(self._state.snapshot(now), self._config)
        self.stats.schedule_seconds += time.perf_counter() - started
        self.stats.cycles += 1
        if self._progress is not None and self.stats.cycles % self._progress_every == 0:
            self.stats.wall_seconds = time.perf_counter() - self._started
            self._progress(now, self.stats)
        for decision in decisions:
            if isinstance(decision, Place):
                self.stats.decisions += 1
                self._place(now, decision.job_id, decision.placement)
            elif isinstance(decision, Preempt):
                self.stats.decisions += 1
                for victim in decision.victims:
                    self._preempt(now, victim, decision.job_id)

    def _place(self, now: float, job_id: str, placement: Placement) -> None:
        pending = self._pop_pending(job_id)
        if pending is None:
            raise SimulationError(f"core placed {job_id!r}, which is not pending at t={now}")
        job = pending.job
        gpus = tuple((rank.node, g) for rank in placement.ranks for g in rank.gpus)
        if len(placement.ranks) != job.replicas or len(gpus) != job.total_gpus:
            raise SimulationError(f"core placed {job_id!r} as {placement} but it asks {job.shape}")
        for key in gpus:
            if not self._cluster.has_node(key[0]) or self._cluster.node(key[0]).state is not NodeState.READY:
                raise SimulationError(f"core placed {job_id!r} on {key[0]!r}, which is not a ready node")
            holder = self._held.get(key)
            if holder is not None:
                raise SimulationError(
                    f"core placed {job_id!r} on {key[0]} GPU {key[1]}, still held by {holder!r} at t={now}"
                )
            self._held[key] = job_id
            self._held_on[key[0]] += 1
        self._free_ready -= len(gpus)
        self._epoch += 1
        sim = self._sim[job_id]
        ranks = tuple(RankRecord(r.node, tuple(r.gpus)) for r in placement.ranks)
        run = _Run(self._epoch, now, ranks, gpus)
        self._runs[job_id] = run
        self._add_running(
            RunningJob(job, placement, now, None, False, pending.attained_gpu_seconds, pending.preempted_by,
                       pending.preempted_at, started_promotion(pending, self._config, now))
        )
        record = self._records[job_id]
        if record.start is None:
            record.start = now
        self._push(now + self._remaining[job_id], _COMPLETE, job_id, run.epoch)
        if self._track_checkpoints:
            run.next_checkpoint = now + sim.checkpoint_interval_seconds
            heapq.heappush(self._checkpoints, (run.next_checkpoint, run.epoch, job_id, run.epoch))

    def _preempt(self, now: float, victim: str, preemptor: str) -> None:
        run = self._runs.get(victim)
        running = self._running.get(victim)
        if run is None or running is None:
            raise SimulationError(f"core preempted {victim!r} for {preemptor!r}, but it is not running at t={now}")
        if running.preempting:
            return
        run.preemptor = preemptor
        self._history.asked(victim, now)
        self._replace_running(
            RunningJob(
                running.job,
                running.placement,
                running.start_time,
                running.last_checkpoint_time,
                True,
                running.attained_gpu_seconds,
                running.preempted_by,
                running.preempted_at,
                running.promoted_service,
            )
        )
        grace = running.job.checkpoint_grace_seconds
        self._push(now + grace, _RELEASE, victim, run.epoch)

    def _advance_checkpoints(self, now: float) -> None:
        """Move `last_checkpoint_time` of jobs whose periodic checkpoint passed since the last cycle."""
        heap = self._checkpoints
        while heap and heap[0][0] <= now:
            _, _, job_id, epoch = heapq.heappop(heap)
            run = self._runs.get(job_id)
            if run is None or run.epoch != epoch:
                continue
            interval = self._sim[job_id].checkpoint_interval_seconds
            last = last_periodic_checkpoint(run.start, now, interval)
            r = self._running[job_id]
            self._replace_running(
                RunningJob(r.job, r.placement, r.start_time, last, r.preempting, r.attained_gpu_seconds, r.preempted_by,
                           r.preempted_at, r.promoted_service)
            )
            run.next_checkpoint = last + interval
            heapq.heappush(heap, (run.next_checkpoint, epoch, job_id, epoch))

    # -- node failures ------------------------------------------------------------------------
    def _plan_failures(self, model: FailureModel) -> None:
        """Failure times for every node, drawn up front from the seed so runs are reproducible."""
        rng = random.Random(self._seed)
        horizon = max((j.submit + j.duration for j in self._workload.jobs), default=0.0) * 2
        for node in self._cluster.nodes:
            at = 0.0
            while True:
                at += rng.expovariate(1.0 / (model.mtbf_hours * 3600.0))
                if at > horizon:
                    break
                self._push(at, _FAIL, node.name, 0)
                at += model.repair_hours * 3600.0
                self._push(at, _REPAIR, node.name, 0)

    def _fail_node(self, now: float, node: str) -> bool:
        self.stats.node_failures += 1
        self._set_node_state(node, NodeState.LOST)
        victims = sorted({job for (n, _), job in self._held.items() if n == node})
        for job_id in victims:
            self._runs[job_id].preemptor = None
            self._end(job_id, now, lost_node=node)
        return True

    def _set_node_state(self, name: str, state: NodeState) -> None:
        self._cluster = Cluster(tuple(replace(n, state=state) if n.name == name else n for n in self._cluster.nodes))
        self._state.set_cluster(self._cluster)
        if self._services is not None:
            self._services.cluster(self._cluster)
        self._recount_free()

    def _final_reasons(self) -> dict[str, str]:
        """Why each never-finished job is still waiting: one last cycle's Pending reasons."""
        if not self._pending:
            return {}
        snapshot = self._state.snapshot(
            math.inf if not self._records else max((r.end or 0.0) for r in self._records.values())
        )
        return {
            d.job_id: f"{d.reason.code}: {d.reason.message}"
            for d in self._schedule(snapshot, self._config)
            if isinstance(d, Pending)
        }
