"""What a quota round hands the core, kept as events are folded instead of gathered at each round.

Why: walking every active job each round to find who waits, which of them hold quota and what is
still held (`classify`), then building the core's snapshot of the waiting ones (a `core_pending()`
per job and a sort by job id) costs ~27 ms of every round on the event loop with ~13,700 jobs
waiting (Kueue's shape), while the loop can neither fold a job's end nor give its quota back. Only a
job's own events change how it is classified or its core object (the view's own indices,
`ClusterView.jobs_where`, rely on the same rule), so the quota service updates this index for the
job of each event it folds (`Quota.folded`), and a round reads it as it stands: `pending()` /
`reserved` / `held()` / `core_pending()`, the last sorted by job id as `ClusterView.snapshot` sorts
them, rebuilt only when a waiting job came, went or changed; and what the core's round derives
from them (`backlog`: each queue's order, the classes, the counts `Exposure` reads). The jobs
holding GPUs are kept as the core's likewise (`core_running`): the same objects from round to
round, so the core's parts derived from them are moved by the jobs that changed instead of built
again (`core.running_parts`).
"""

from __future__ import annotations

import bisect
from enum import Enum

from corral import core
from corral.core.backlog import KeptBacklog
from corral.projection import ClusterView, JobState, JobView, QuotaPhase, core_running

#: (queue, GPUs, user, code, message): a waiting job's class and the reason its log records (None:
#: none yet). A round refuses a class for one reason: a group told that reason word for word is
#: passed over whole (`Quota._refusals`), not job by job.
Told = tuple[str, int, str | None, str | None, str | None]


class Kind(Enum):
    """How a round counts an active job (`classify`)."""

    WAITING = "waiting"  # pending, no quota: the core decides for it
    RESERVED = "reserved"  # pending, holding quota it may keep or be revoked
    HELD = "held"  # quota not given back yet (ended, released, requeued): counts as used
    NONE = "none"  # nothing to the round (running with GPUs, or no quota and not waiting)


def classify(j: JobView) -> Kind:
    """The round's view of one active job, from its quota phase: quota not given back counts as
    used while its GPUs do not (the job holds none, and a started attempt is no longer pending)."""
    phase = j.quota_phase
    if phase is QuotaPhase.WAITING:
        return Kind.WAITING
    if phase is QuotaPhase.RESERVED:
        return Kind.RESERVED
    if phase is QuotaPhase.OWED and not j.holding:
        return Kind.HELD
    if phase is QuotaPhase.IN_USE and not j.holding and j.state is not JobState.PENDING:
        return Kind.HELD
    return Kind.NONE


class RoundInputs:
    """The round's inputs, per job, updated by `update` for each folded event's job."""

    def __init__(self) -> None:
        self.waiting: dict[str, JobView] = {}  # WAITING and RESERVED: the snapshot's pending jobs
        self.reserved: set[str] = set()
        self.unreserved = 0  # how many WAITING: a round with none decides nothing
        self._held: dict[str, tuple[str, int]] = {}
        self._core: dict[str, core.PendingJob] = {}
        self._ids: list[str] = []  # the keys of `waiting`, sorted
        self._sorted: tuple[core.PendingJob, ...] | None = ()
        #: the WAITING jobs by (queue, GPUs, user, recorded reason's code, message) (`told`)
        self.told: dict[Told, set[str]] = {}
        self._told_as: dict[str, Told] = {}
        #: the waiting jobs as the core's round reads them (`core.backlog`), kept likewise
        self.backlog = KeptBacklog()
        self._running: dict[str, core.RunningJob] = {}  # the jobs holding GPUs, as the core's
        self._running_sorted: tuple[core.RunningJob, ...] | None = None

    def update(self, job_id: str, job: JobView | None) -> None:
        """`job` is the view's job after an event of its own was folded (None: no longer active)."""
        kind = classify(job) if job is not None else Kind.NONE
        if self._running.pop(job_id, None) is not None or (job is not None and job.holding):
            self._running_sorted = None
        was = self.waiting.get(job_id)
        if was is job and job is not None and (kind is Kind.WAITING or kind is Kind.RESERVED) \
                and (kind is Kind.RESERVED) == (job_id in self.reserved) \
                and self._core[job_id] is job.core_pending():
            # the same job, kind and core object (a reason recorded, most often): only what its
            # log says may have changed, so the backlog and the sorted tuple stand as they are
            if kind is Kind.WAITING:
                self._untell(job_id)
                self._tell(job_id, job, self._core[job_id])
            return
        self._untell(job_id)
        if was is not None and job_id not in self.reserved:
            self.unreserved -= 1
        self.reserved.discard(job_id)
        self._held.pop(job_id, None)
        if job is None or kind is Kind.NONE or kind is Kind.HELD:
            self.backlog.drop(job_id)
            if was is not None:
                del self.waiting[job_id]
                del self._core[job_id]
                del self._ids[bisect.bisect_left(self._ids, job_id)]
                self._sorted = None
            if job is not None and kind is Kind.HELD:
                self._held[job_id] = (job.queue, job.quota_gpus)
            return
        pending = job.core_pending()
        if kind is Kind.RESERVED:
            self.reserved.add(job_id)
        else:
            self.unreserved += 1
            self._tell(job_id, job, pending)
        if was is None:
            self.waiting[job_id] = job
            bisect.insort(self._ids, job_id)
            self._sorted = None
        elif self._core[job_id] is not pending:
            self._sorted = None
        self._core[job_id] = pending
        self.backlog.put(pending, kind is Kind.RESERVED)

    def _tell(self, job_id: str, job: JobView, pending: core.PendingJob) -> None:
        said = job.reason
        told = (pending.job.queue, pending.job.total_gpus, pending.job.user,
                said.code if said is not None else None, said.message if said is not None else None)
        self._told_as[job_id] = told
        self.told.setdefault(told, set()).add(job_id)

    def _untell(self, job_id: str) -> None:
        told = self._told_as.pop(job_id, None)
        if told is not None:
            group = self.told[told]
            group.discard(job_id)
            if not group:
                del self.told[told]

    def held(self) -> list[tuple[str, int]]:
        """(queue, GPUs) still reserved by jobs that neither run nor wait with it."""
        return list(self._held.values())

    def core_pending(self) -> tuple[core.PendingJob, ...]:
        """The waiting jobs as the core's PendingJob, sorted by job id (`ClusterView.snapshot`)."""
        if self._sorted is None:
            self._sorted = tuple(map(self._core.__getitem__, self._ids))
        return self._sorted

    def core_running(self, view: ClusterView, config: core.SchedulerConfig) -> tuple[core.RunningJob, ...]:
        """The view's jobs holding GPUs as the core's RunningJob under `config`, sorted by job id
        (`ClusterView.snapshot`)."""
        if self._running_sorted is None:
            kept = self._running
            for j in view.running_jobs():
                if j.job_id not in kept:
                    kept[j.job_id] = core_running(j, config)
            self._running_sorted = tuple(kept[i] for i in sorted(kept))
        return self._running_sorted
