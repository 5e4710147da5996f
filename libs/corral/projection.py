"""The cluster as a fold of the event log: jobs, nodes, GPU allocations and queues.

Why one projection: every service, `corral jobs`, `corral why` and `corral replay --until` need the
same answer to "what holds which GPU, what waits and why" — computed from events alone, so that a
service that was killed rebuilds exactly what it had, and a replay up to any moment shows the
cluster as it was then. Applying an event is idempotent: each stream's version is remembered and
an event at or below it is ignored (redeliveries, and a service's own appends coming back).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import Enum, StrEnum
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from corral import core
from corral.contracts import events as ev
from corral.contracts.cluster import NodeInventory
from corral.contracts.envelope import Event, Reason
from corral.contracts.jobspec import JobSpec
from corral.contracts.lifecycle import LifecycleCode
from corral.contracts.queues import QueueSpec
from corral.lifecycle import GangEvent, GangState, transition

if TYPE_CHECKING:  # the scheduling core's types: loaded when a view is first translated for it
    from corral.core import Job as CoreJob
    from corral.core import Node as CoreNode
    from corral.core import NodeState as CoreNodeState
    from corral.core import PendingJob as CorePendingJob
    from corral.core import Placement as CorePlacement
    from corral.core import escalation
else:
    # The per-object caches' types. A stored view's decoder (msgspec) resolves the annotation of
    # every field, these too, and reading one job must not load the core's model for them: they
    # are never stored (`corral.readmodel.codec` drops them), so at run time they are Any.
    CoreJob = CoreNode = CoreNodeState = CorePendingJob = CorePlacement = Any

_JOB_ID = attrgetter("job_id")


class QuotaPhase(StrEnum):
    """Where a job stands with its queue's quota (`JobView.quota_phase`): the one answer
    placement, quota and quota's rounds read."""

    NONE = "none"  # holds no quota and waits for none
    WAITING = "waiting"  # pending, no quota yet: quota's round decides for it
    RESERVED = "reserved"  # pending, holding quota for this attempt: placement places it
    IN_USE = "in_use"  # holds quota for an attempt that started (its GPUs count, not the quota)
    OWED = "owed"  # holds quota it must give back: it ended, or its attempt was released


class JobState(StrEnum):
    SUBMITTED = "SUBMITTED"      # in the log, not yet judged by admission
    PENDING = "PENDING"          # admitted, waiting for quota and/or GPUs
    STARTING = "STARTING"        # GPUs reserved, workers starting (gang barrier)
    RUNNING = "RUNNING"
    PREEMPTING = "PREEMPTING"    # asked to checkpoint; still holds its GPUs
    REQUEUING = "REQUEUING"      # GPUs released, about to wait again
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    REJECTED = "REJECTED"
    HELD = "HELD"                # admitted, kept from running until released (corral hold)

    @property
    def terminal(self) -> bool:
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.REJECTED)

    @property
    def holds_gpus(self) -> bool:
        return self in (JobState.STARTING, JobState.RUNNING, JobState.PREEMPTING)


#: The states of a job an operator's request acts on: a hold a pending job, a release a held one,
#: a requeue one starting or running; in any other state admission records nothing (the request's
#: verdict is UNCHANGED) and `corral hold|release|requeue` says so before sending it.
ACTS_ON: dict[type[Event], tuple[JobState, ...]] = {
    ev.JobHeld: (JobState.PENDING,),
    ev.JobHoldReleased: (JobState.HELD,),
    ev.JobRequeueRequested: (JobState.STARTING, JobState.RUNNING),
}


class Applied(Enum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"  # at or below the stream's known version: already folded
    GAP = "gap"              # a version is missing before it: re-read the stream from the log


@dataclass
class Fence:
    """A released attempt whose processes may still run (`corral.lifecycle`'s RELEASING): its GPUs
    on each node in `open` stay allocated to the job until that node's GpusReleased."""

    attempt: int
    ranks: list[ev.RankPlacement]
    placed_at: datetime | None
    released_at: datetime
    released_by: str = ""  # the GangReleased's event id (placement looks its log position up)
    released_position: int | None = None
    started: set[int] = field(default_factory=set)
    exits: dict[int, int | None] = field(default_factory=dict)
    open: dict[str, tuple[int, ...]] = field(default_factory=dict)  # node -> GPUs still held
    _core_placement: CorePlacement | None = field(default=None, repr=False, compare=False)

    def core_placement(self) -> core.Placement:
        if self._core_placement is None:
            self._core_placement = core.Placement(
                tuple(core.RankPlacement(r.rank, r.node, tuple(r.gpus)) for r in self.ranks))
        return self._core_placement


@dataclass(frozen=True)
class Rendezvous:
    """Where an attempt's rank 0 listens (`MASTER_ADDR:MASTER_PORT`) and on which node."""

    node: str
    address: str
    port: int


@dataclass
class JobView:
    job_id: str
    spec: JobSpec | None = None
    user: str | None = None
    submitted_at: datetime | None = None
    state: JobState = JobState.SUBMITTED
    attempt: int = 0
    quota_gpus: int = 0
    borrowed: int = 0
    quota_stale: bool = False  # quota held from an attempt whose GPUs were released: give it back
    quota_reserved_at: datetime | None = None  # when quota reserved what the job holds
    ranks: list[ev.RankPlacement] = field(default_factory=list)  # current (or last) placement
    placed_at: datetime | None = None
    running_since: datetime | None = None
    ended_at: datetime | None = None
    reason: Reason | None = None  # the last reason: why pending, rejected, failed, preempted
    preempt: ev.PreemptRequested | None = None
    preempted_by: set[str] = field(default_factory=set)
    #: `corral requeue`: the request, and the attempt it was made for (preemption acts on it once)
    requeue_request: ev.JobRequeueRequested | None = None
    requeue_attempt: int | None = None
    preempted_at: list[float] = field(default_factory=list)  # when each attempt was asked to checkpoint
    started_ranks: set[int] = field(default_factory=set)
    exited_ranks: dict[int, int | None] = field(default_factory=dict)
    #: what the node said of each rank of the current attempt that did not exit 0: a rank that
    #: could not start says why (`corral.lifecycle` puts it on the JobFailed)
    exit_reasons: dict[int, Reason] = field(default_factory=dict)
    checkpoint: str | None = None
    checkpoint_at: datetime | None = None
    resume_from: str | None = None
    restarts: int = 0
    attained_gpu_seconds: float = 0.0
    #: the starvation limit's inputs (`core.levels.promote_at`): when the job last gave its GPUs
    #: back (its attempt's GangReleased) and how long its last run lasted (JobRunning to release)
    requeued_at: datetime | None = None
    last_run_seconds: float = 0.0
    #: work the last released attempt threw away: GPU-seconds since its last checkpoint (or start)
    lost_gpu_seconds: float = 0.0
    cancel_requested: bool = False
    #: When the current wait began (admitted, requeued, released from a hold), and its
    #: WaitExceeded once quota recorded one (`core.escalation`: once per wait)
    waiting_since: datetime | None = None
    wait_exceeded: ev.WaitExceeded | None = None
    holding: bool = False  # GPUs reserved and not yet released (also while cancelling)
    gang: GangState | None = None  # the current attempt's gang while it holds its GPUs
    fences: dict[int, Fence] = field(default_factory=dict)  # released attempts whose GPUs are still held
    #: attempt -> its rendezvous port, while it holds it (until rank 0's node's GPUs are released)
    rendezvous: dict[int, Rendezvous] = field(default_factory=dict)
    version: int = 0
    _core_job: tuple[JobSpec, datetime, CoreJob] | None = field(default=None, repr=False, compare=False)
    _core_placement: tuple[list[ev.RankPlacement], CorePlacement] | None = field(default=None, repr=False,
                                                                                   compare=False)
    _core_pending: tuple[CoreJob, float, int, datetime | None, CorePendingJob] | None = field(
        default=None, repr=False, compare=False)

    @property
    def active(self) -> bool:
        """Still of interest to the deciding services: not over, or over but holding GPUs or quota."""
        return not self.state.terminal or self.holding or self.quota_gpus > 0 or bool(self.fences)

    @property
    def quota_phase(self) -> QuotaPhase:
        pending = self.state is JobState.PENDING and self.spec is not None
        if not self.quota_gpus:
            return QuotaPhase.WAITING if pending else QuotaPhase.NONE
        if self.state.terminal or self.quota_stale:
            return QuotaPhase.OWED
        return QuotaPhase.RESERVED if pending else QuotaPhase.IN_USE

    @property
    def deciding(self) -> bool:
        """Quota reserved the job and placement has said nothing of it since: it is placed, or its
        reason recorded, once placement has decided (`corral.services.placement.first_reason`)."""
        return self.quota_phase is QuotaPhase.RESERVED and self.reason is None

    @property
    def queue(self) -> str:
        return self.spec.queue if self.spec else "?"

    @property
    def gpus(self) -> int:
        return self.spec.total_gpus if self.spec else 0

    @property
    def priority(self) -> int:
        return int(self.spec.priority) if self.spec else 0

    @property
    def nodes(self) -> list[str]:
        return sorted({r.node for r in self.ranks})

    def core_job(self) -> core.Job:
        assert self.spec is not None and self.submitted_at is not None
        # Every reconcile translates every waiting and running job: remember the translation for
        # as long as the spec and submit time are the very objects it was made from.
        cached = self._core_job
        if cached is not None and cached[0] is self.spec and cached[1] is self.submitted_at:
            return cached[2]
        from corral.translate import job_from_spec

        job = job_from_spec(self.job_id, self.spec, self.submitted_at.timestamp(), self.user)
        self._core_job = (self.spec, self.submitted_at, job)
        return job

    def core_pending(self) -> core.PendingJob:
        """The job as the core's PendingJob; the same object while nothing it holds has changed, so
        the core's per-job memos (see `core.ClassMemo`, kept by the services) hit across reconciles."""
        cached = self._core_pending
        known = self._core_job
        # the hit first, without a call: every round asks this of every waiting job (thousands)
        if cached is not None and known is not None and known[0] is self.spec \
                and known[1] is self.submitted_at and cached[0] is known[2] \
                and cached[1] == self.attained_gpu_seconds \
                and cached[2] == len(self.preempted_by) + len(self.preempted_at) \
                and cached[3] is self.requeued_at:
            return cached[4]
        # (preempted_by and preempted_at only ever grow, see `_preempt_requested`: their sizes are a
        # version; each release sets a new `requeued_at`, and `last_run_seconds` only with it.) A miss:
        # the translation changed, or what the job holds did.
        job = self.core_job()
        released = self.requeued_at
        pending = core.PendingJob(job, self.attained_gpu_seconds, frozenset(self.preempted_by),
                                  tuple(self.preempted_at), None if released is None else released.timestamp(),
                                  self.last_run_seconds)
        self._core_pending = (job, self.attained_gpu_seconds, len(self.preempted_by) + len(self.preempted_at),
                              released, pending)
        return pending

    def core_placement(self) -> core.Placement:
        # Cached for as long as `ranks` is the very list it was made from (every fold replaces it).
        cached = self._core_placement
        if cached is not None and cached[0] is self.ranks:
            return cached[1]
        placement = core.Placement(tuple(core.RankPlacement(r.rank, r.node, tuple(r.gpus)) for r in self.ranks))
        self._core_placement = (self.ranks, placement)
        return placement


@dataclass
class NodeView:
    name: str
    inventory: NodeInventory
    lost: bool = False
    draining: bool = False  # no new work (corral drain); running jobs go on
    drain: ev.NodeDrained | None = None  # the drain in force (`evict`: its jobs are asked to move)
    #: what its agent measures now (disk or memory pressure): no new work while any holds
    conditions: tuple[ev.NodeCondition, ...] = ()
    #: GPUs its agent finds unhealthy now (NVML: XID, ECC, fallen off the bus), and GPUs an admin
    #: drained (`corral gpu drain`): neither takes new work (`out_of_service`)
    unhealthy: dict[int, ev.GpuProblem] = field(default_factory=dict)
    drained_gpus: dict[int, ev.GpuDrained] = field(default_factory=dict)
    allocations: dict[int, str] = field(default_factory=dict)  # GPU index -> job id
    registered_at: datetime | None = None
    address: str | None = None  # where other hosts reach it (None: not advertised)
    rendezvous_ports: tuple[int, int] | None = None  # MASTER_PORT range (None: the default)
    version: int = 0
    _core_node: tuple[NodeInventory, CoreNodeState, frozenset[int], CoreNode] | None = field(
        default=None, repr=False, compare=False)

    @property
    def gpu_count(self) -> int:
        return len(self.inventory.gpus)

    @property
    def out_of_service(self) -> frozenset[int]:
        """Its GPUs that take no new work: unhealthy or drained (those it has)."""
        have = {g.index for g in self.inventory.gpus}
        return frozenset(i for i in (*self.unhealthy, *self.drained_gpus) if i in have)

    def core_node(self) -> core.Node:
        from corral.core.conditions import node_state
        from corral.translate import node_from_inventory

        state = node_state(lost=self.lost, draining=self.draining, conditions=self.conditions)
        out = self.out_of_service
        cached = self._core_node
        if cached is not None and cached[0] is self.inventory and cached[1] is state and cached[2] == out:
            return cached[3]
        node = node_from_inventory(self.inventory, state, out)
        self._core_node = (self.inventory, state, out, node)
        return node


@dataclass
class ClusterView:
    """Everything the log says, folded. Mutated only through `apply`."""

    jobs: dict[str, JobView] = field(default_factory=dict)
    nodes: dict[str, NodeView] = field(default_factory=dict)
    queues: dict[str, QueueSpec] = field(default_factory=dict)
    #: The numbered versions of the queue tree (QueueTreeApplied, `corral queues --history`),
    #: oldest first; version N is `tree_versions[N - 1]`.
    tree_versions: list[ev.QueueTreeApplied] = field(default_factory=list)
    #: The scheduling policy in force (the last PolicyInForce; none recorded: `corral`).
    policy: str = "corral"
    #: (user, submission id) -> the job it created: a submission id is its user's own, so two
    #: users' equal ids are two jobs (`submission_key`).
    submissions: dict[tuple[str, str], str] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    #: The jobs that are `JobView.active`, kept as events are folded: the services scan these on
    #: every reconcile, and `jobs` grows with every job ever submitted.
    active: dict[str, JobView] = field(default_factory=dict)
    #: Rendezvous ports held by live gangs: address -> port -> (job id, attempt). A port is held
    #: from the GangReserved until rank 0's node's GPUs of that attempt are released (its
    #: processes are gone), so placement never gives it to two live gangs (`core.rendezvous`).
    #: Keyed by address, not node: simulated nodes on one machine share an address.
    ports: dict[str, dict[int, tuple[str, int]]] = field(default_factory=dict)
    position: int = 0  # the last global position folded (when known)
    last_event_at: datetime | None = None
    _cluster: tuple[tuple[core.Node, ...], core.Cluster] | None = field(default=None, repr=False, compare=False)
    #: Counts the folded events that change what a node offers the core (registered, lost,
    #: drained, conditions, GPU health): `cluster()` is asked per submission by admission, and
    #: rebuilt each time it would cost O(nodes) per job; it is rebuilt when this count moves.
    _node_changes: int = field(default=0, repr=False, compare=False)
    _cluster_at: tuple[int, int] = field(default=(-1, -1), repr=False, compare=False)
    #: The active jobs for which a predicate holds, per predicate, kept as events are folded once
    #: first asked for (`jobs_where`; `running_jobs` and `fenced_jobs` are two): placement asked
    #: both of every active job on every reconcile, a quarter of its event loop with thousands
    #: waiting for quota (py-spy, Kueue shape), and preemption listed its victims to requeue from
    #: every active job at each reconcile, 39% of its time.
    _watched: dict[Callable[[JobView], bool], dict[str, JobView]] = field(default_factory=dict, repr=False,
                                                                            compare=False)
    #: A deciding service's fold: a job that is over and holds nothing (`JobView.active` false) is
    #: dropped from `jobs`, so the fold is O(active jobs + nodes) however long the log; its id stays
    #: in `forgotten` (and its stream in `versions`), and a later event of it changes nothing.
    #: Off for every reader that shows ended jobs (the CLI, `corral replay`, the read model).
    forget_ended: bool = field(default=False, compare=False)
    #: Off for a reader whose decisions never ask which GPU holds what: quota and preemption hand
    #: the core the running jobs' placements and leave fenced GPUs out (`snapshot(releasing=False)`).
    #: Nodes' allocations, the fences of released attempts and rendezvous ports are then not kept,
    #: so such a reader is not sent GpusReleased (its `flow`); a job's state, attempt, placement and
    #: holding are folded as always.
    gpu_ledger: bool = field(default=True, compare=False)
    forgotten: set[str] = field(default_factory=set, repr=False, compare=False)

    # ---- folding -----------------------------------------------------------------------------
    def apply(self, event: Event, version: int | None = None, position: int | None = None, *,
              gaps: bool = False) -> Applied:
        """Fold one event. `version` is its place in its stream (None: trust the caller's order).

        `gaps=True` is for a reader that is sent only some event types: a version beyond the next
        one is folded rather than reported as a GAP (`versions` then says "at least"; appends
        guarded by it may lose a race and re-read, never write on a wrong version)."""
        if version is not None:
            known = self.versions.get(event.stream, 0)
            if version <= known:
                return Applied.DUPLICATE
            if version > known + 1 and not gaps:
                return Applied.GAP
            self.versions[event.stream] = version
        if position is not None:
            self.position = max(self.position, position)
        self.last_event_at = event.occurred_at
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            job_id = getattr(event, "victim_job_id", None) or getattr(event, "job_id", None)
            if job_id and job_id in self.forgotten:
                return Applied.APPLIED  # over and holding nothing: nothing later changes what it was
            handler(self, event)
            job = self.jobs.get(job_id) if job_id else None
            if job is not None:
                if job.active:
                    self.active[job.job_id] = job
                else:
                    self.active.pop(job.job_id, None)
                self._index(job)
                if self.forget_ended and not job.active:
                    self._forget(job)
        return Applied.APPLIED

    def _forget(self, job: JobView) -> None:
        """Drop an ended job that holds nothing (`forget_ended`), keeping its id."""
        del self.jobs[job.job_id]
        self.forgotten.add(job.job_id)
        if job.spec is not None and job.spec.submission_id:
            key = (job.user or "", job.spec.submission_id)
            if self.submissions.get(key) == job.job_id:
                del self.submissions[key]

    def _index(self, job: JobView) -> None:
        """Keep every index of `jobs_where` as `job` now is: a job's own events are the only ones
        that change what is true of it."""
        active = job.job_id in self.active
        for belongs, index in self._watched.items():
            if active and belongs(job):
                index[job.job_id] = job
            else:
                index.pop(job.job_id, None)

    def job(self, job_id: str) -> JobView:
        view = self.jobs.get(job_id)
        if view is None:
            view = self.jobs[job_id] = JobView(job_id=job_id)
        return view

    # ---- questions ---------------------------------------------------------------------------
    def free_gpus(self) -> int:
        """GPUs of nodes not lost that are neither allocated nor out of service."""
        return sum(n.gpu_count - len(n.allocations) - len(n.out_of_service - n.allocations.keys())
                   for n in self.nodes.values() if not n.lost)

    def capacity(self) -> int:
        return sum(n.gpu_count for n in self.nodes.values() if not n.lost)

    def standing_gates(self) -> list[str]:
        """The evidence gates in force: those recorded with the last version of the queue tree."""
        return list(self.tree_versions[-1].gates or []) if self.tree_versions else []

    def queue_usage(self) -> dict[str, int]:
        """GPUs each queue holds by quota reservation (leaf queues)."""
        usage: dict[str, int] = {}
        for j in self.active.values():
            if j.quota_gpus:
                usage[j.queue] = usage.get(j.queue, 0) + j.quota_gpus
        return usage

    def cluster(self) -> core.Cluster:
        if self._cluster is not None and self._cluster_at == (self._node_changes, len(self.nodes)):
            return self._cluster[1]
        self._cluster_at = (self._node_changes, len(self.nodes))
        nodes = tuple(self.nodes[n].core_node() for n in sorted(self.nodes))
        # The same nodes give the same Cluster object, so the core's per-cluster caches keep working.
        cached = self._cluster
        if cached is not None and len(cached[0]) == len(nodes) \
                and all(a is b for a, b in zip(cached[0], nodes, strict=True)):
            return cached[1]
        cluster = core.Cluster(nodes)
        self._cluster = (nodes, cluster)
        return cluster

    def core_queues(self) -> tuple[core.QueueConfig, ...]:
        from corral.translate import queue_from_spec

        return tuple(queue_from_spec(self.queues[q])
                     for q in sorted(self.queues, key=lambda n: (n.count("/"), n)))

    def max_waits(self) -> dict[str, float | None]:
        """Each queue's `max_wait` in seconds (None: not set), for `core.escalation`."""
        return {name: q.max_wait for name, q in self.queues.items()}

    def waits(self) -> list[escalation.Wait]:
        """The current wait of every job waiting for quota or GPUs (held jobs do not wait)."""
        from corral.core import escalation

        out = []
        for j in self.active.values():
            if j.state is JobState.PENDING and j.waiting_since is not None:
                e = j.wait_exceeded
                out.append(escalation.Wait(j.job_id, j.queue, j.waiting_since.timestamp(),
                                                None if e is None else (e.limit_queue, e.max_wait_seconds)))
        return out

    def jobs_where(self, belongs: Callable[[JobView], bool]) -> Mapping[str, JobView]:
        """The active jobs for which `belongs` holds, by id: built on the first call, then kept as
        events are folded (the same mapping object; `belongs` must read only the job itself, and
        be one object, e.g. a module-level function, for the index to be found again)."""
        index = self._watched.get(belongs)
        if index is None:
            index = self._watched[belongs] = {j.job_id: j for j in self.active.values() if belongs(j)}
        return index

    def running_jobs(self) -> list[JobView]:
        """The jobs holding GPUs (in no particular order)."""
        return list(self.jobs_where(_holds_gpus).values())

    def fenced_jobs(self) -> list[JobView]:
        """Jobs with a released attempt whose GPUs are still held (see `Fence`; in no particular order)."""
        return list(self.jobs_where(_has_fence).values())

    def releasing_gpus(self) -> dict[str, dict[int, str]]:
        """node -> GPU -> job id, for GPUs held by released attempts until their ranks are gone."""
        out: dict[str, dict[int, str]] = {}
        for j in self.fenced_jobs():
            for fence in j.fences.values():
                for node, gpus in fence.open.items():
                    for g in gpus:
                        out.setdefault(node, {})[g] = j.job_id
        return out

    def releasing_running(self) -> list[core.RunningJob]:
        """The fenced GPUs as the core sees GPUs on their way out: one job asked to stop per fence
        (id `<job>@<attempt>:releasing`, never a victim), so no job is placed on them and a job
        that needs them waits for them (WAITING_FOR_PREEMPTION) instead of preempting others."""
        out = []
        for j in sorted(self.fenced_jobs(), key=lambda j: j.job_id):
            if j.spec is None or j.submitted_at is None:
                continue
            for attempt, fence in sorted(j.fences.items()):
                ranks = tuple(core.RankPlacement(r.rank, r.node, tuple(r.gpus)) for r in fence.ranks
                              if r.node in fence.open)
                if not ranks:
                    continue
                job = replace(j.core_job(), id=f"{j.job_id}@{attempt}:releasing", preemptible=False)
                out.append(core.RunningJob(job=job, placement=core.Placement(ranks),
                                           start_time=fence.released_at.timestamp(), preempting=True))
        return out

    def scheduler_config(self) -> core.SchedulerConfig:
        """The core's configuration of the policy in force (`policy`): what a reader reruns the
        services' decisions with (`corral why`'s hint). A policy this code does not know, recorded
        by a newer Corral, reads as the default."""
        from corral.core.model import POLICIES, SchedulerConfig

        return SchedulerConfig.named(self.policy) if self.policy in POLICIES else SchedulerConfig()

    def snapshot(self, now: float, pending: list[JobView] | None = None, *,
                 releasing: bool = False, core_pending: tuple[core.PendingJob, ...] | None = None,
                 running: tuple[core.RunningJob, ...] | None = None,
                 config: core.SchedulerConfig | None = None) -> core.Snapshot:
        """The core's view: `pending` defaults to every admitted job waiting for GPUs.
        `releasing`: include the GPUs of released attempts still fenced (`releasing_running`):
        placement must (they are not free); quota and preemption count usage and leave them out.
        `core_pending`: the waiting jobs already as the core's, sorted by job id (quota keeps
        them between rounds, `corral.services.quota.round_inputs`); `pending` is then not read.
        `running`: the jobs holding GPUs already as the core's, sorted by job id (kept likewise).
        `config`: the policy the running jobs run under (their promotion, `core_running`)."""
        if releasing and not self.gpu_ledger:
            raise ValueError("a view without the GPU ledger keeps no fenced GPUs (see `gpu_ledger`)")
        if core_pending is None:
            waiting = pending if pending is not None else [j for j in self.active.values()
                                                           if j.state is JobState.PENDING]
            core_pending = tuple([j.core_pending() for j in sorted(waiting, key=_JOB_ID)])
        fenced = tuple(self.releasing_running()) if releasing else ()
        return core.Snapshot(
            now=now,
            cluster=self.cluster(),
            queues=self.core_queues(),
            pending=core_pending,
            running=(running if running is not None
                     else tuple(core_running(j, config) for j in sorted(self.running_jobs(), key=_JOB_ID))) + fenced,
        )


def core_running(j: JobView, config: core.SchedulerConfig | None = None) -> core.RunningJob:
    """A job holding GPUs as the core's RunningJob. `config`: the policy it runs under, for its
    promotion (`promoted_service`, `core.levels.started_promotion`): the job as it waited is
    promoted at the time quota reserved it, when the core started it (the quota round's play-out
    starts it so, `core.kept_preemption.started_job`); None: no promotion."""
    start = (j.running_since or j.placed_at or j.submitted_at or datetime.min).timestamp()
    promoted = None
    if config is not None and config.promotion_resets_level:
        decided = j.quota_reserved_at.timestamp() if j.quota_reserved_at is not None else start
        from corral.core.levels import started_promotion  # the core's model: loaded with the config
        promoted = started_promotion(j.core_pending(), config, decided)
    return core.RunningJob(
        job=j.core_job(), placement=j.core_placement(),
        start_time=start,
        last_checkpoint_time=j.checkpoint_at.timestamp() if j.checkpoint_at else None,
        preempting=j.state is JobState.PREEMPTING,
        attained_gpu_seconds=j.attained_gpu_seconds,
        preempted_by=frozenset(j.preempted_by),
        preempted_at=tuple(j.preempted_at),
        promoted_service=promoted,
    )


def _holds_gpus(job: JobView) -> bool:
    return job.holding


def _has_fence(job: JobView) -> bool:
    return bool(job.fences)


# ---- event handlers (one per event type) ------------------------------------------------------

def _submitted(view: ClusterView, e: ev.JobSubmitted) -> None:
    j = view.job(e.job_id)
    j.spec, j.user, j.submitted_at, j.version = e.spec, e.user, e.occurred_at, j.version + 1
    key = submission_key(e)
    if key is not None:
        view.submissions.setdefault(key, e.job_id)


def submission_key(e: ev.JobSubmitted) -> tuple[str, str] | None:
    """What makes two submissions the same one: the same user and the same client-chosen
    submission id. Scoped to the user, so no one can claim another's id (and be answered with
    their job, or have theirs dropped as a duplicate). A recorded submission without a user is
    keyed under the empty user name."""
    submission = e.submission_id or e.spec.submission_id
    return (e.user or "", submission) if submission else None


def _admitted(view: ClusterView, e: ev.JobAdmitted) -> None:
    j = view.job(e.job_id)
    if j.state is JobState.SUBMITTED:
        j.state = JobState.PENDING
        _wait_starts(j, e.occurred_at)


def _wait_starts(j: JobView, at: datetime) -> None:
    j.waiting_since, j.wait_exceeded = at, None


def _wait_exceeded(view: ClusterView, e: ev.WaitExceeded) -> None:
    # Only for the wait it was recorded in: quota appends it guarded by the job stream's version,
    # so it follows that wait's start in the stream; a stray one (another attempt) changes nothing.
    j = view.job(e.job_id)
    if j.state is JobState.PENDING and e.attempt == j.attempt:
        j.wait_exceeded = e


def _rejected(view: ClusterView, e: ev.JobRejected) -> None:
    j = view.job(e.job_id)
    j.state, j.reason, j.ended_at = JobState.REJECTED, e.reason, e.occurred_at


def _quota_reserved(view: ClusterView, e: ev.QuotaReserved) -> None:
    # The job's last reason (quota's, or why it was requeued) is no longer why it waits: placement
    # decides it from now on, and says its own reason once it has one (`JobView.deciding`).
    j = view.job(e.job_id)
    j.quota_gpus, j.borrowed, j.quota_stale = e.gpus, e.borrowed, False
    j.quota_reserved_at, j.reason = e.occurred_at, None


def _quota_released(view: ClusterView, e: ev.QuotaReleased) -> None:
    j = view.job(e.job_id)
    j.quota_gpus, j.borrowed, j.quota_stale, j.quota_reserved_at = 0, 0, False, None


def _gang_reserved(view: ClusterView, e: ev.GangReserved) -> None:
    j = view.job(e.job_id)
    j.ranks, j.placed_at, j.attempt = list(e.ranks), e.occurred_at, e.attempt
    j.state, j.reason, j.holding, j.gang = JobState.STARTING, None, True, GangState.STARTING
    j.started_ranks, j.exited_ranks, j.exit_reasons, j.preempt = set(), {}, {}, None
    j.resume_from = e.resume_from
    if not view.gpu_ledger:
        return
    _hold_port(view, j, e)
    for r in e.ranks:
        node = view.nodes.get(r.node)
        if node is not None:
            for g in r.gpus:
                node.allocations[g] = e.job_id


def _hold_port(view: ClusterView, j: JobView, e: ev.GangReserved) -> None:
    """Record the attempt's rendezvous port as held on its address (a repeated GangReserved of the
    same attempt replaces what the first one held)."""
    _free_port(view, j, e.attempt)
    master = min(e.ranks, key=lambda r: r.rank).node
    j.rendezvous[e.attempt] = Rendezvous(node=master, address=e.master_addr, port=e.master_port)
    view.ports.setdefault(e.master_addr, {})[e.master_port] = (e.job_id, e.attempt)


def _free_port(view: ClusterView, j: JobView, attempt: int, node: str | None = None) -> None:
    """Give back the attempt's rendezvous port (only when `node`, if given, is rank 0's node)."""
    held = j.rendezvous.get(attempt)
    if held is None or (node is not None and held.node != node):
        return
    del j.rendezvous[attempt]
    ports = view.ports.get(held.address)
    if ports is not None and ports.get(held.port) == (j.job_id, attempt):
        del ports[held.port]
        if not ports:
            del view.ports[held.address]


def _pending(view: ClusterView, e: ev.PlacementPending) -> None:
    view.job(e.job_id).reason = e.reason


def _preempt_requested(view: ClusterView, e: ev.PreemptRequested) -> None:
    j = view.job(e.victim_job_id)
    if j.state.holds_gpus:
        if j.state is not JobState.PREEMPTING:  # asked again for the same attempt: no new preemption
            j.preempted_at.append(e.occurred_at.timestamp())
        j.state, j.preempt, j.reason = JobState.PREEMPTING, e, e.reason
        if e.for_job_id is not None:
            j.preempted_by.add(e.for_job_id)
        j.gang = _moved(j.gang, GangEvent.PREEMPT)


def _moved(state: GangState | None, event: GangEvent) -> GangState | None:
    """The gang's next state by the lifecycle's table; an event that is no move leaves it."""
    if state is None:
        return None
    return transition(state, event) or state


def _checkpoint_done(view: ClusterView, e: ev.CheckpointDone) -> None:
    """The job's resume point is the current attempt's newest checkpoint. One of an attempt the
    job was requeued past (its host was cut off, kept running, and reported once back) is kept in
    the log but moves nothing: that run diverged from the one the job resumed."""
    j = view.job(e.job_id)
    if e.attempt != j.attempt:
        return
    j.checkpoint, j.checkpoint_at = e.path, e.occurred_at


def _fence(view: ClusterView, j: JobView, e: ev.GangReleased) -> None:
    """The released attempt keeps its GPUs allocated until each node's GpusReleased."""
    if not j.holding or j.gang is None or e.attempt != j.attempt:
        return
    j.gang = None
    if not view.gpu_ledger:
        return
    held: dict[str, list[int]] = {}
    for r in j.ranks:
        node = view.nodes.get(r.node)
        if node is not None:
            held.setdefault(r.node, []).extend(g for g in r.gpus if node.allocations.get(g) == j.job_id)
    fence = Fence(attempt=j.attempt, ranks=j.ranks, placed_at=j.placed_at, released_at=e.occurred_at,
                  released_by=e.event_id, started=j.started_ranks, exits=j.exited_ranks,
                  open={n: tuple(sorted(g)) for n, g in held.items() if g})
    if fence.open:
        j.fences[j.attempt] = fence
    master = j.rendezvous.get(j.attempt)
    if master is not None and master.node not in fence.open:
        _free_port(view, j, j.attempt)  # rank 0's node holds nothing of it any more


def _gpus_allocated(view: ClusterView, e: ev.GpusAllocated) -> None:
    """The node's share of a GangReserved, folded to the same effect (the same transaction wrote
    both). A reader that re-reads only a node's stream after losing a race on it (placement is
    not sent its own events: see each event's `flow`) learns of the allocation from it."""
    node = view.nodes.get(e.node) if view.gpu_ledger else None
    if node is not None:
        for g in e.gpus:
            node.allocations[g] = e.job_id


def _gpus_released(view: ClusterView, e: ev.GpusReleased) -> None:
    node = view.nodes.get(e.node)
    if node is not None:
        for g in e.gpus:
            if node.allocations.get(g) == e.job_id:
                del node.allocations[g]
    j = view.jobs.get(e.job_id)
    if j is not None:
        _free_port(view, j, e.attempt, e.node)
    fence = j.fences.get(e.attempt) if j is not None else None
    if j is not None and fence is not None:
        fence.open.pop(e.node, None)
        if not fence.open and transition(GangState.RELEASING, GangEvent.FREED) is GangState.RELEASED:
            del j.fences[e.attempt]


def _gang_released(view: ClusterView, e: ev.GangReleased) -> None:
    j = view.job(e.job_id)
    if e.attempt != j.attempt:
        # An earlier attempt's release (placement never appends one, but the log is not trusted):
        # that attempt is already released; it must not release, requeue or bill the current one.
        return
    if j.running_since is not None:  # an attempt released before it ran leaves the last run as it was
        j.last_run_seconds = max(0.0, (e.occurred_at - j.running_since).total_seconds())
        j.attained_gpu_seconds += j.last_run_seconds * j.gpus
        if j.spec is not None and j.submitted_at is not None:  # the core's rule: from the last checkpoint
            checkpoint = j.checkpoint_at.timestamp() if j.checkpoint_at else None
            j.lost_gpu_seconds = core.RunningJob(j.core_job(), j.core_placement(), j.running_since.timestamp(),
                                                 checkpoint).lost_work(e.occurred_at.timestamp())
    _fence(view, j, e)
    j.running_since, j.holding, j.requeued_at = None, False, e.occurred_at
    j.quota_stale = j.quota_gpus > 0
    if not j.state.terminal:
        j.state = JobState.REQUEUING
    j.reason = e.reason


def _requeued(view: ClusterView, e: ev.JobRequeued) -> None:
    j = view.job(e.job_id)
    if not j.state.terminal:
        j.state, j.reason, j.attempt, j.resume_from = JobState.PENDING, e.reason, e.attempt, e.resume_from
        j.ranks, j.preempt = [], None
        _wait_starts(j, e.occurred_at)
        if e.reason.code == LifecycleCode.RESTARTING:
            j.restarts += 1


def _worker_started(view: ClusterView, e: ev.WorkerStarted) -> None:
    j = view.job(e.job_id)
    fence = j.fences.get(e.attempt)
    if fence is not None:  # a report of a released attempt still counts for its fence
        fence.started.add(e.rank)
    elif e.attempt == j.attempt:
        j.started_ranks.add(e.rank)


def _worker_exited(view: ClusterView, e: ev.WorkerExited) -> None:
    j = view.job(e.job_id)
    fence = j.fences.get(e.attempt)
    if fence is not None:
        fence.exits[e.rank] = e.exit_code
    elif e.attempt == j.attempt:
        j.exited_ranks[e.rank] = e.exit_code
        if e.exit_code != 0:
            j.exit_reasons[e.rank] = e.reason


def _running(view: ClusterView, e: ev.JobRunning) -> None:
    j = view.job(e.job_id)
    if j.state is JobState.STARTING:
        j.state, j.running_since = JobState.RUNNING, e.occurred_at
        j.gang = _moved(j.gang, GangEvent.ALL_STARTED)


def _ended(state: JobState) -> Callable[[ClusterView, Any], None]:
    def handler(view: ClusterView, e: ev.JobCompleted | ev.JobFailed | ev.JobCancelled) -> None:
        j = view.job(e.job_id)
        j.state, j.ended_at = state, e.occurred_at
        if not isinstance(e, ev.JobCompleted):
            j.reason = e.reason
        if isinstance(e, ev.JobCancelled):
            j.gang = _moved(j.gang, GangEvent.CANCEL)
    return handler


def _cancel_requested(view: ClusterView, e: ev.JobCancelRequested) -> None:
    view.job(e.job_id).cancel_requested = True


def _node_registered(view: ClusterView, e: ev.NodeRegistered) -> None:
    view._node_changes += 1
    inv = NodeInventory(node=e.node, gpus=e.gpus, nvlink_domains=e.nvlink_domains, rack=e.rack, zone=e.zone,
                        cpus=e.cpus, host_memory_gib=e.host_memory_gib, datasets=dict(e.datasets))
    existing = view.nodes.get(e.node)
    if existing is None:
        existing = view.nodes[e.node] = NodeView(name=e.node, inventory=inv, registered_at=e.occurred_at)
    else:
        existing.inventory, existing.lost, existing.registered_at = inv, False, e.occurred_at
    existing.address = e.address
    existing.rendezvous_ports = (e.rendezvous_ports.low, e.rendezvous_ports.high) if e.rendezvous_ports else None


def _node_lost(view: ClusterView, e: ev.NodeLost) -> None:
    view._node_changes += 1
    node = view.nodes.get(e.node)
    if node is not None:
        node.lost = True


def _queue_configured(view: ClusterView, e: ev.QueueConfigured) -> None:
    view.queues[e.queue.name] = e.queue


def _node_drained(view: ClusterView, e: ev.NodeDrained | ev.NodeUndrained) -> None:
    view._node_changes += 1
    node = view.nodes.get(e.node)
    if node is not None:
        node.drain = e if isinstance(e, ev.NodeDrained) else None
        node.draining = node.drain is not None


def _node_conditions(view: ClusterView, e: ev.NodeConditionsChanged) -> None:
    view._node_changes += 1
    node = view.nodes.get(e.node)
    if node is not None:
        node.conditions = tuple(e.conditions)


def _gpu_health(view: ClusterView, e: ev.GpuHealthChanged) -> None:
    view._node_changes += 1
    node = view.nodes.get(e.node)
    if node is not None:
        node.unhealthy = {p.gpu: p for p in e.unhealthy}


def _gpu_drained(view: ClusterView, e: ev.GpuDrained | ev.GpuUndrained) -> None:
    view._node_changes += 1
    node = view.nodes.get(e.node)
    if node is None:
        return
    if isinstance(e, ev.GpuDrained):
        node.drained_gpus[e.gpu] = e
    else:
        node.drained_gpus.pop(e.gpu, None)


def _held(view: ClusterView, e: ev.JobHeld) -> None:
    j = view.job(e.job_id)
    if j.state is JobState.PENDING:
        who = e.user or e.actor
        j.state = JobState.HELD
        j.reason = Reason(code=LifecycleCode.HELD.value, message=f"held by {who}" + (f": {e.message}" if e.message
                          else "") + f"; corral release {e.job_id} lets it wait for GPUs again",
                          details={"user": who})
        j.quota_stale = j.quota_gpus > 0  # a held job gives its quota back


def _requeue_requested(view: ClusterView, e: ev.JobRequeueRequested) -> None:
    j = view.job(e.job_id)
    if j.state in (JobState.STARTING, JobState.RUNNING):
        j.requeue_request, j.requeue_attempt = e, j.attempt


def _hold_released(view: ClusterView, e: ev.JobHoldReleased) -> None:
    j = view.job(e.job_id)
    if j.state is JobState.HELD:
        j.state, j.reason = JobState.PENDING, None
        _wait_starts(j, e.occurred_at)


def _tree_applied(view: ClusterView, e: ev.QueueTreeApplied) -> None:
    # The QueueConfigured events recorded with it set `queues`; this keeps the version's record.
    view.tree_versions.append(e)


def _policy_in_force(view: ClusterView, e: ev.PolicyInForce) -> None:
    view.policy = e.policy


_HANDLERS: dict[type[Event], Callable[[ClusterView, Any], None]] = {
    ev.JobSubmitted: _submitted,
    ev.JobAdmitted: _admitted,
    ev.JobRejected: _rejected,
    ev.QuotaReserved: _quota_reserved,
    ev.QuotaReleased: _quota_released,
    ev.GangReserved: _gang_reserved,
    ev.PlacementPending: _pending,
    ev.WaitExceeded: _wait_exceeded,
    ev.PreemptRequested: _preempt_requested,
    ev.CheckpointDone: _checkpoint_done,
    ev.GangReleased: _gang_released,
    ev.GpusAllocated: _gpus_allocated,
    ev.GpusReleased: _gpus_released,
    ev.JobRequeued: _requeued,
    ev.WorkerStarted: _worker_started,
    ev.WorkerExited: _worker_exited,
    ev.JobRunning: _running,
    ev.JobCompleted: _ended(JobState.COMPLETED),
    ev.JobFailed: _ended(JobState.FAILED),
    ev.JobCancelled: _ended(JobState.CANCELLED),
    ev.JobCancelRequested: _cancel_requested,
    ev.NodeRegistered: _node_registered,
    ev.NodeLost: _node_lost,
    ev.QueueConfigured: _queue_configured,
    ev.QueueTreeApplied: _tree_applied,
    ev.PolicyInForce: _policy_in_force,
    ev.NodeDrained: _node_drained,
    ev.NodeConditionsChanged: _node_conditions,
    ev.NodeUndrained: _node_drained,
    ev.GpuHealthChanged: _gpu_health,
    ev.GpuDrained: _gpu_drained,
    ev.GpuUndrained: _gpu_drained,
    ev.JobHeld: _held,
    ev.JobHoldReleased: _hold_released,
    ev.JobRequeueRequested: _requeue_requested,
}
