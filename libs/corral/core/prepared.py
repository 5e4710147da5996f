"""Prepared: everything a cycle starts from, derived from a snapshot -- built here, or kept.

Why: a cycle needs more than the snapshot says -- the queue tree, usage per queue, the
free-GPU index, GPUs being released, who preempted whom, the order of the waiting jobs, their
classes, when each running job's GPUs come back. Deriving them is O(running + waiting) and a
replay's cycles change one or two jobs each, so `SchedulerState` keeps them current between
cycles instead. Both ways produce the same `Prepared`, and a `Cycle` reads only that: there is
one way into a cycle, and `prepare(snapshot)` is what the kept state must equal (property-tested
in tests/unit/core/test_scheduler_state.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter

from corral.core.backfill import Release
from corral.core.gpuset import FreeGpus
from corral.core.levels import resets_at, service_read, thresholds_of
from corral.core.model import PendingJob, RunningJob, SchedulerConfig, Snapshot
from corral.core.ordering import iter_pending
from corral.core.preemption.eligibility import NONE_SPARED, spared
from corral.core.quota import QueueTree, QueueUsage
from corral.core.running import RunningIndex
from corral.core.running_parts import RunningParts
from corral.core.shortcuts import ClassMemo

_BY_ID = attrgetter("job.id")


@dataclass(slots=True)
class Prepared:
    """A cycle's input. `usage` and `fi` are fresh copies the cycle may change; the rest it reads.

    order: the pending jobs in the policy's order (lazily, given the cycle's usage); classes:
    every pending job's class id (numbers are only compared within one cycle); live and sample:
    the classes in order of their first job in `snapshot.pending`, with their job counts and that
    first job (None: the cycle counts them itself); spared: the running jobs each waiting job may
    not preempt for their history with it (only those with some; its class reads them); releases:
    the backfill release of every running job not asked to checkpoint, by job id (any order; empty
    when the policy does not backfill);
    kept: the running jobs as the owner keeps them (`Candidates`; None: the cycle computes);
    thresholds: the service levels the policy ranks by (`levels.thresholds_of`)."""

    snapshot: Snapshot
    tree: QueueTree
    usage: QueueUsage
    fi: FreeGpus
    running: list[RunningJob]  # sorted by job id
    releasing: dict[int, int]  # GPUs of jobs asked to checkpoint: still taken in `fi`, free soon
    spared: Mapping[str, frozenset[str]]  # waiting job -> `eligibility.spared`, when not empty
    order: Callable[[QueueUsage], Iterator[PendingJob]]
    classes: Mapping[str, int]
    releases: Mapping[str, Release]
    live: dict[int | None, int] | None = None
    sample: dict[int, PendingJob] | None = None
    kept: RunningIndex | None = None
    thresholds: tuple[float, ...] = ()


def prepare(snapshot: Snapshot, config: SchedulerConfig, memo: ClassMemo) -> Prepared:
    """A cycle's input from scratch; `memo` numbers the pending jobs' classes (the caller's, so
    that its answers carry over between cycles) and keeps what the running jobs give
    (`RunningParts`) while the caller passes the same tuple of them."""
    ids = [p.job.id for p in snapshot.pending] + [r.job.id for r in snapshot.running]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"Snapshot: job ids must be unique across pending and running, repeated: {dup}")
    parts = RunningParts.of(snapshot, memo)
    tree = parts.tree(snapshot, config)
    fi = parts.fi.copy()
    running = parts.kept.jobs.copy()

    def order(usage: QueueUsage) -> Iterator[PendingJob]:
        return iter_pending(snapshot, config, tree=tree, usage=usage)

    thresholds = thresholds_of(config)
    read = service_read(config)
    spared = _spared(snapshot.pending, running)
    per_user = tree.per_user

    return Prepared(
        snapshot=snapshot,
        tree=tree,
        usage=parts.usage(tree),
        fi=fi,
        running=running,
        releasing=dict(parts.releasing),
        spared=spared,
        order=order,
        classes={p.job.id: memo.class_id(p, per_user, read, spared.get(p.job.id, NONE_SPARED),
                                         resets_at(p, config, snapshot.now))
                 for p in snapshot.pending},
        releases=parts.releases() if config.backfill else {},
        kept=parts.kept,
        thresholds=thresholds,
    )


def _spared(pending: Sequence[PendingJob], running: list[RunningJob]) -> dict[str, frozenset[str]]:
    """`eligibility.spared` of every waiting job that has some."""
    victims_of: dict[str, list[str]] = {}
    for r in running:
        for x in r.preempted_by:
            victims_of.setdefault(x, []).append(r.job.id)
    if not victims_of and not any(p.preempted_by for p in pending):
        return {}
    ids = {r.job.id for r in running}
    out: dict[str, frozenset[str]] = {}
    for p in pending:
        if p.preempted_by or p.job.id in victims_of:
            found = spared(p, ids, victims_of)
            if found:
                out[p.job.id] = found
    return out
