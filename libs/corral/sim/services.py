"""The services pipeline's round in the simulator, from inputs kept between rounds as the services keep theirs.

Why: the engine's services pipeline runs the live services' round (`corral.core.pipeline.run_round`)
once per cycle, and a replay has thousands of cycles with a job or two changed between two of
them. Deriving each step's input from the round's snapshot (the quota step's backlog, each
placement and preemption ask's `prepare`) costs most of a round. So, as the combined cycle keeps a
`SchedulerState`, the services round keeps:
- what the quota step reads of the waiting jobs (`core.backlog.Backlog`: each queue's order, the
  classes, the counts), as the live quota service keeps it (`KeptBacklog`, told each job that
  came, reserved, revoked or placed);
- a `SchedulerState` per step whose config is fixed (`KeptSteps`): placement's over the jobs
  holding quota, preemption's over every waiting job; each told every change of the engine's
  state, and each ask of the round moves it to the ask's inputs (the holders asked about; the
  jobs the ask starts, started and taken back after) instead of preparing a cycle from scratch.
Every ask decides what `placement_step` / `preemption_step` decide on the round's snapshot (the
kept states equal `prepare(snapshot)`, tests/unit/core/test_scheduler_state.py; the round's
inputs are checked at every round against the snapshot's, tests/unit/sim/test_services_kept.py).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from corral.core import Cluster, Decision, Pending, PendingJob, Placement, Preempt, QueueConfig, RunningJob
from corral.core.backlog import KeptBacklog
from corral.core.kept_preemption import started_job
from corral.core.model import SchedulerConfig, Snapshot
from corral.core.pipeline import run_round
from corral.core.state import SchedulerState
from corral.core.steps import Step, StepMemos, step_config

#: Placement states kept: a round asks placement about a few sets of holders (the quota step's
#: passes, then the round's own), much the same sets as the last round's; each ask moves the kept
#: state nearest its set (fewest jobs to add or remove).
_PLACING_STATES = 2


class KeptSteps(StepMemos):
    """The steps' memos with each step's kept `SchedulerState`: an ask about the round's snapshot
    (`round_of`) is answered from them; any other ask as `StepMemos` answers it."""

    __slots__ = ("_pending", "_snapshot", "placing", "preempting")

    def __init__(self, cluster: Cluster, queues: Sequence[QueueConfig], config: SchedulerConfig) -> None:
        super().__init__()
        self.placing = tuple(SchedulerState(cluster, queues, step_config(Step.PLACEMENT, config))
                             for _ in range(_PLACING_STATES))
        self.preempting = SchedulerState(cluster, queues, step_config(Step.PREEMPTION, config))
        self._snapshot: Snapshot | None = None
        self._pending: Mapping[str, PendingJob] = {}

    def round_of(self, snapshot: Snapshot, pending: Mapping[str, PendingJob]) -> None:
        """The round's snapshot, whose state the kept states hold (`pending`: its waiting jobs by id)."""
        self._snapshot, self._pending = snapshot, pending

    def place(self, snapshot: Snapshot, config: SchedulerConfig, holding: Collection[str], *,
              explain: bool = True) -> list[Decision]:
        if explain or snapshot is not self._snapshot:
            return super().place(snapshot, config, holding, explain=explain)
        key = frozenset(holding)
        last = self._placed
        if last is not None and last[0] is snapshot and last[1] == key:
            return last[3] if not last[2] else [d for d in last[3] if not isinstance(d, Pending)]
        state = min(self.placing, key=lambda kept: len(kept.pending.keys() ^ key))
        for job_id in [i for i in state.pending if i not in key]:
            state.remove_pending(job_id)
        for job_id in sorted(key.difference(state.pending)):
            state.add_pending(self._pending[job_id])
        out = state.cycle(snapshot.now)
        self._placed = (snapshot, key, False, out)
        return out

    def preempt(self, snapshot: Snapshot, config: SchedulerConfig, placed: Mapping[str, Placement]) -> list[Preempt]:
        if snapshot is not self._snapshot:
            return super().preempt(snapshot, config, placed)
        key = tuple(placed.items())
        last = self._preempts
        if last is not None and last[0] is snapshot and last[1] == key:
            return last[2]
        state, now = self.preempting, snapshot.now
        started = [state.remove_pending(job_id) for job_id in placed]
        for p, placement in zip(started, placed.values(), strict=True):
            state.add_running(started_job(p, placement, now, config))
        out = [d for d in state.cycle(now) if isinstance(d, Preempt)]
        for p in reversed(started):
            state.remove_running(p.job.id)
        for p in started:
            state.add_pending(p)
        self._preempts = (snapshot, key, out)
        return out

    # -- the engine's changes, told to both kept states ------------------------------------------
    def came(self, p: PendingJob) -> None:
        self.preempting.add_pending(p)

    def went(self, job_id: str) -> None:
        self.preempting.remove_pending(job_id)
        for state in self.placing:
            if job_id in state.pending:
                state.remove_pending(job_id)

    def started(self, r: RunningJob) -> None:
        for state in (*self.placing, self.preempting):
            state.add_running(r)

    def stopped(self, job_id: str) -> None:
        for state in (*self.placing, self.preempting):
            state.remove_running(job_id)

    def changed(self, r: RunningJob) -> None:
        for state in (*self.placing, self.preempting):
            state.replace_running(r)

    def cluster(self, cluster: Cluster) -> None:
        for state in (*self.placing, self.preempting):
            state.set_cluster(cluster)


class ServicesRound:
    """The services' round over the engine's jobs, told each change to them (`came`, `went` for
    the waiting jobs; `started`, `stopped`, `changed` for the running ones; `cluster`);
    `holding`: the waiting jobs that hold quota (reserved, not placed yet)."""

    def __init__(self, cluster: Cluster, queues: Sequence[QueueConfig], config: SchedulerConfig) -> None:
        self.config = config
        self.holding: set[str] = set()
        self.backlog = KeptBacklog()
        self.steps = KeptSteps(cluster, queues, config)  # kept from round to round as the services keep theirs
        self._running: tuple[RunningJob, ...] | None = None  # the last round's snapshot's, while none changed

    def came(self, p: PendingJob) -> None:
        """A job waits (it arrived or was requeued): it holds no quota."""
        self.backlog.put(p, False)
        self.steps.came(p)

    def went(self, job_id: str) -> None:
        """A waiting job was placed: its reservation is used."""
        self.holding.discard(job_id)
        self.backlog.drop(job_id)
        self.steps.went(job_id)

    def started(self, r: RunningJob) -> None:
        self._running = None
        self.steps.started(r)

    def stopped(self, job_id: str) -> None:
        self._running = None
        self.steps.stopped(job_id)

    def changed(self, r: RunningJob) -> None:
        self._running = None
        self.steps.changed(r)

    def cluster(self, cluster: Cluster) -> None:
        self.steps.cluster(cluster)

    def run(self, now: float, state: SchedulerState) -> list[Decision]:
        """The round's Place and Preempt decisions, in that order, on `state.snapshot(now)`; the
        jobs quota reserved for keep their reservation until placed. The snapshot's tuple of
        running jobs is the last round's while none changed: the quota step finds the parts it
        derives from them again (`RunningParts.of`) instead of moving them."""
        if self._running is None:
            self._running = tuple(state.running.values())
        pending = state.pending
        snapshot = Snapshot(now, state.cluster, state.queues, tuple(pending.values()), self._running)
        self.steps.round_of(snapshot, pending)
        done = run_round(snapshot, self.config, holding=self.holding, memos=self.steps, explain=False,
                         backlog=self.backlog.frozen())  # the replay reads no reasons
        for job_id in sorted(done.revoked):
            self.holding.discard(job_id)
            self.backlog.put(pending[job_id], False)
        for job_id in sorted(done.reserved):
            self.holding.add(job_id)
            self.backlog.put(pending[job_id], True)
        return [*done.placed, *done.preempts]
