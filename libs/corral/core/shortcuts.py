"""The cycle's speed-ups, kept apart from its rules: class answers, negative caches, early stop.

Why: a busy cycle of a replay decides ~1,000 waiting jobs of a few kinds, and most of them
get the answer the first of their kind got. Deciding each in full makes replays slow; but written
inside the rules, the speed-ups would hide them. They live here, and each is exact -- it
changes how fast the cycle answers, never what (tests/unit/core/test_core_fast_paths.py):
- `ClassMemo`: a job's class (`class_key`: everything its decision reads but its id and place in
  the order) as a small int, memoised per PendingJob object. The caller owns the memo (the
  services keep theirs between reconciles; `SchedulerState` numbers its own classes).
- `Shortcuts`: one cycle's `version` (bumped by every change to its committed state: free GPUs,
  usage, claims, victims, reservation), each class's Pending answer at a version, negative
  caches valid for the whole cycle (free and releasing GPUs and preemption candidates only
  shrink while it runs; the epochs mark the two exceptions), and the dry mode of a probe.
- `EarlyStop`: drives a cycle for its actions only, and stops once every class still ahead in
  the order already got its Pending answer at the current version.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral.core import reasons
from corral.core.decisions import Decision, Pending, Reason, ReasonCode
from corral.core.levels import service_class
from corral.core.model import Job, PendingJob

if TYPE_CHECKING:
    from corral.core.cycle import Cycle

# reasons that record GPUs held for the job: never shared with other jobs. RESERVED_FOR names the
# job ("starting J now would delay it") or counts the GPUs starved jobs are owed, which grow at
# one version, but changes nothing: shared, and reworded where it must be (`Cycle.decide`), so that
# its class counts as answered (`EarlyStop`).
_PER_JOB_REASONS = frozenset({ReasonCode.WAITING_FOR_PREEMPTION})

# how many jobs in a row must leave the state unchanged before `EarlyStop` probes the other classes
_QUIET_BEFORE_PROBING = 8


def class_key(
    p: PendingJob, by_user: bool = False, read: tuple[float, ...] | None = None,
    spared: frozenset[str] = frozenset(), promoted: bool = False,
) -> tuple[object, ...]:
    """Everything about a pending job that its decision reads, except its id and its place in the
    order: jobs with equal keys get equal answers while the cycle's state is unchanged. Its user
    only `by_user` (a queue sets `max_gpus_per_user`, the one rule that reads it): otherwise the
    same job of two users is one class. Its attained service as much as the policy reads it
    (`levels.service_read`: all of it under LAS, the level under FAIR_LAS, none under the others),
    and whether the starvation limit has promoted it (`promoted`: it preempts as level 0). Of who
    preempted whom the decision reads only `spared` (`eligibility.spared`: the running jobs it may
    not preempt for their history with it), not `preempted_by`: a job preempted by one
    that has ended since is in the class of a job never preempted."""
    job = p.job
    service = -1.0 if promoted else service_class(p.attained_gpu_seconds, read)
    return (
        job.queue,
        job.replicas,
        job.gpus_per_replica,
        job.topology,
        job.gpu,
        job.priority,
        job.estimated_runtime_seconds,
        spared,
        service,
        job.user if by_user else None,
    )


#: The fields of a `Job` that say where it can run: its shape (`shape`, `shaped`).
SHAPE_FIELDS = ("replicas", "gpus_per_replica", "topology", "gpu")
#: The fields that name, date, rank or time it: none says where it can run. Every field of `Job` is
#: in one of the two (tests/unit/core/test_shape.py), so a field added later is placed knowingly.
NOT_SHAPE_FIELDS = ("id", "queue", "submit_time", "priority", "preemptible", "checkpoint_grace_seconds",
                    "min_runtime_seconds", "estimated_runtime_seconds", "user")


def shape(job: Job) -> tuple[object, ...]:
    """What placement depends on: jobs of equal shape fit (or not) on the same free GPUs."""
    return (job.replicas, job.gpus_per_replica, job.topology, job.gpu)


def shaped(job: Job) -> Job:
    """`job` reduced to its shape: a Job of no one and no queue, submitted at 0, which any question
    of where it can ever run (admission's cluster-wide checks) answers for every job of its shape."""
    return Job(id="shape", queue="shape", replicas=job.replicas, gpus_per_replica=job.gpus_per_replica,
               submit_time=0.0, gpu=job.gpu, topology=job.topology)


class ClassMemo:
    """Class ids of PendingJob objects, kept by the caller from cycle to cycle.

    The engine and the services keep their PendingJob objects between cycles, so the key (whose
    Topology and GpuRequest hash in Python, not C) is built and hashed once per job instead of
    once per job per cycle. Entries keep their PendingJob alive, so an id() is never reused while
    it is in the table. Ids are only compared within one cycle, so `between_cycles` may forget
    everything once the memo holds more than `limit` jobs. `running`: what `prepared.prepare`
    derived from the last snapshot's running jobs (a `prepared.RunningParts`, found again while
    the caller passes the same tuple of them)."""

    __slots__ = ("_ids", "_of", "limit", "running")

    def __init__(self, limit: int = 200_000) -> None:
        self.limit = limit
        self.running: object = None
        self._ids: dict[tuple[object, ...], int] = {}
        self._of: dict[int, tuple[PendingJob, int, bool, tuple[float, ...] | None, frozenset[str], bool]] = {}

    def class_id(
        self, p: PendingJob, by_user: bool = False, read: tuple[float, ...] | None = None,
        spared: frozenset[str] = frozenset(), promoted: bool = False,
    ) -> int:
        hit = self._of.get(id(p))
        if (hit is not None and hit[0] is p and hit[2] is by_user and hit[3] == read
                and (hit[4] is spared or hit[4] == spared) and hit[5] is promoted):
            return hit[1]
        key = class_key(p, by_user, read, spared, promoted)
        n = self._ids.get(key)
        if n is None:
            n = self._ids[key] = len(self._ids)
        self._of[id(p)] = (p, n, by_user, read, spared, promoted)
        return n

    def between_cycles(self) -> None:
        if len(self._of) > self.limit:
            self._of.clear()
            self._ids.clear()


class WouldChange(Exception):
    """A probe (a dry decision, see `Cycle.probe`) reached a step that would change the cycle's state."""


class Shortcuts:
    """One cycle's version, class answers and negative caches (see the module docstring)."""

    __slots__ = (
        "answers",
        "borrow_epoch",
        "dry",
        "never",
        "no_fit",
        "no_fit_reason",
        "no_preempt",
        "no_release_fit",
        "release_epoch",
        "shape_ids",
        "shapes",
        "standings",
        "unmasked",
        "version",
    )

    def __init__(self) -> None:
        self.version = 0
        self.dry = False  # while probing a class out of order: change nothing
        self.answers: dict[int, tuple[int, Reason, bool]] = {}  # class -> (version, reason, starves)
        self.no_fit: set[tuple[object, bool]] = set()  # (shape, avoiding the reservation)
        self.no_fit_reason: dict[object, tuple[int, Reason]] = {}  # shape -> (version, why)
        self.unmasked: dict[object, tuple[int, object]] = {}  # shape -> (version, fit ignoring the reservation)
        self.no_release_fit: set[object] = set()  # shapes: releasing GPUs do not make them fit
        self.no_preempt: set[object] = set()  # `preempt_key`s without a plan
        self.borrow_epoch = 0  # a queue grew over its guarantee: it may hold reclaimable jobs now
        self.release_epoch = 0  # the releasing pool grew
        self.shapes: dict[str, int] = {}  # job id -> its shape's number (`shape_of`)
        self.shape_ids: dict[tuple[object, ...], int] = {}
        self.never: dict[int, object] = {}  # shape number -> static feasibility (`Cycle._never`)
        self.standings: dict[tuple[int, str, int, int], tuple[Reason, Reason]] = {}

    def shape_of(self, job: Job) -> int:
        """`shape(job)` as a small number, built and hashed once per job a cycle. The negative
        caches are keyed by shape and asked several times for every job decided: the shape tuple
        holds a Topology and a GpuRequest, which hash in Python, not C (~6 % of a LAS cycle)."""
        n = self.shapes.get(job.id)
        if n is None:
            key = shape(job)
            n = self.shape_ids.get(key)
            if n is None:
                n = self.shape_ids[key] = len(self.shape_ids)
            self.shapes[job.id] = n
        return n

    def changing(self) -> None:
        """The cycle's committed state is about to change: a probe stops here; else a new version."""
        if self.dry:
            raise WouldChange
        self.version += 1

    def with_standing(self, reason: Reason, queue: str, used: int, guaranteed: int) -> Reason:
        """`reasons.with_standing`, once per reason object and standing a cycle: the jobs that do
        not fit share one Reason per shape and state version, and rewording it for each of them
        (a new message string every time) was ~3 % of a cycle. The entry keeps its reason alive,
        so an id is never reused while it is in the table."""
        key = (id(reason), queue, used, guaranteed)
        hit = self.standings.get(key)
        if hit is None or hit[0] is not reason:
            hit = self.standings[key] = (reason, reasons.with_standing(reason, queue, used, guaranteed))
        return hit[1]

    def shared_answer(self, key: int | None) -> tuple[Reason, bool] | None:
        """The class's Pending answer at this version (and whether it starves the queue), if any."""
        if key is None:
            return None
        hit = self.answers.get(key)
        if hit is None or hit[0] != self.version:
            return None
        return hit[1], hit[2]

    def remember(self, key: int | None, version: int, decision: Decision, starves: bool) -> None:
        """Share a Pending answer with the class, if deciding it changed nothing and it names no one."""
        if (
            key is not None
            and isinstance(decision, Pending)
            and self.version == version
            and decision.reason.code not in _PER_JOB_REASONS
        ):
            self.answers[key] = (version, decision.reason, starves)

    def releasing_grew(self) -> None:
        self.release_epoch += 1
        self.no_release_fit.clear()

    def preempt_key(self, p: PendingJob, *, service: float, spared: frozenset[str], check_quota: bool) -> object:
        """Jobs with equal keys get equal preemption answers until a borrower grows: placing a
        job in a queue over its guarantee can make that queue's older jobs reclaimable. `spared`:
        the running jobs it may not preempt for their history with it (`eligibility.spared`);
        `service`: what of its attained service the answer reads (LAS: all of it, FAIR_LAS: its
        level, else nothing)."""
        job = p.job
        return (
            self.shape_of(job),
            job.queue,
            job.priority,
            spared,
            service,
            check_quota,
            self.borrow_epoch,
            self.release_epoch,
        )


class EarlyStop:
    """The Place and Preempt decisions of `cycle.run()`, without deciding jobs that cannot act.

    Live classes are those with jobs still ahead in the order; `resolved` holds the live classes
    answered Pending at the current state version. When every live class is resolved (and no job
    without a class is left), the rest of the order would only repeat answers. A class is
    resolved by its first job in the order, or earlier by a probe: once the state has not changed
    for a while, each unresolved class is decided once out of order, dry (`Cycle.probe`); the
    classes of over-share queues, last in the fair-share order, are resolved without walking
    every job ahead of them.
    """

    def __init__(self, cycle: Cycle) -> None:
        self.cycle = cycle
        self.fast = cycle.fast
        self.live, self.sample = self._classes()
        self.resolved: set[int] = set()
        self.seen = self.fast.version
        self.quiet = 0  # jobs decided since the state last changed
        self.probed = -1  # the version the probes last ran at

    def _classes(self) -> tuple[dict[int | None, int], dict[int, PendingJob]]:
        """Job counts per class, and each class's first job, in order of first appearance."""
        prepared = self.cycle.prepared
        if prepared.live is not None and prepared.sample is not None:
            return prepared.live, prepared.sample
        live: dict[int | None, int] = {}
        sample: dict[int, PendingJob] = {}
        for p in prepared.snapshot.pending:
            k = self.cycle.class_of(p)
            live[k] = live.get(k, 0) + 1
            if k is not None and k not in sample:
                sample[k] = p
        return live, sample

    def run(self) -> list[Decision]:
        out: list[Decision] = []
        for p in self.cycle.order():
            if self.cycle.blocker is not None:
                break  # strict order: everything behind the blocked job waits
            self._sync()
            self._probe_when_quiet()
            if len(self.resolved) == len(self.live) and None not in self.live:
                break
            d = self._decide(p)
            if not isinstance(d, Pending):
                out.append(d)
        return out

    def _sync(self) -> None:
        """The state changed since the last look: no class is resolved any more."""
        if self.fast.version != self.seen:
            self.resolved.clear()
            self.seen, self.quiet = self.fast.version, 0

    def _probe_when_quiet(self) -> None:
        if self.quiet < _QUIET_BEFORE_PROBING or self.probed == self.seen or None in self.live:
            return
        self.probed = self.seen
        for k in self.live:
            if k in self.resolved:
                continue
            assert k is not None
            if not self.cycle.probe(self.sample[k], k):
                break
            self.resolved.add(k)

    def _decide(self, p: PendingJob) -> Decision:
        k = self.cycle.class_of(p)
        d = self.cycle.decide(p, k)
        self.quiet += 1
        left = self.live[k] - 1
        if left:
            self.live[k] = left
        else:
            del self.live[k]
            if k is not None:
                self.resolved.discard(k)
        if self.fast.version != self.seen:
            self._sync()
        elif left and k is not None and self.fast.shared_answer(k) is not None:
            self.resolved.add(k)
        return d
