"""The placement step on a full cluster: the answers of the jobs that joined the wait.

Why: with no GPU free or being released, the placement cycle places nothing, and its state
changes at most once, at the first job in the order that could ever fit (it takes the backfill reservation, or in
strict order blocks the rest); every later job's answer depends on that state and on the job
alone. So once the full step has answered every waiting job, while the cluster, the queues and
the running jobs stay as they were and its first job still waits, every job it answered keeps its
answer, and a job that joins gets the answer the full step would give it from a cycle over the
first job and the joiners (a job whose inputs changed is one that left and joined again). The
order is the same at any time unless the policy ranks by time, and the queue tree the same while
every job is of a configured queue (a queue named only by jobs exists while they do); otherwise
only the full step answers. Checked against the full step in tests/unit/core/test_joiners.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.core.cycle import Cycle
from corral.core.decisions import Decision
from corral.core.model import PendingJob, SchedulerConfig, Snapshot
from corral.core.ordering import key_of
from corral.core.shortcuts import ClassMemo
from corral.core.steps import Step, step_config


def head_of(snapshot: Snapshot, decisions: Sequence[Decision]) -> PendingJob | None:
    """The first job `placement_step(snapshot)` answered (its `decisions`), which `joiners_step`
    needs; None when a job of `snapshot` is of a queue it does not configure."""
    if not decisions or not _configured(snapshot):
        return None
    first = decisions[0].job_id
    return next((p for p in snapshot.pending if p.job.id == first), None)


def _configured(snapshot: Snapshot) -> bool:
    names = {q.name for q in snapshot.queues}
    return all(p.job.queue in names for p in snapshot.pending) and all(r.job.queue in names for r in snapshot.running)


def joiners_step(snapshot: Snapshot, config: SchedulerConfig, head: PendingJob, *,
                 memo: ClassMemo | None = None) -> list[Decision] | None:
    """`placement_step`'s decisions of the jobs of `snapshot.pending` other than `head`, as the full
    step gives them on a snapshot with the same cluster, queues and running jobs whose waiting jobs
    are these and others the full step answered with `head` first (`head_of`; see the module
    docstring).

    None when that does not hold on `snapshot` alone: a GPU is free or being released, the order
    depends on the time, a job is of a queue not configured, a joiner comes before `head`, or the
    state does not change at `head` (it takes no reservation, blocks no one); the full step
    answers then."""
    placing = step_config(Step.PLACEMENT, config)
    if key_of(placing, snapshot.now) is not None or head not in snapshot.pending or not _configured(snapshot):
        return None
    cycle = Cycle.of(snapshot, placing, memo)
    if cycle.fi.total_free or cycle.gpus.releasing:
        return None
    order = cycle.order()
    first = next(order)
    cycle.decide(first, cycle.class_of(first))
    if first != head or (placing.backfill and cycle.reservation is None) or (cycle.strict and cycle.blocker is None):
        return None  # the state may change at a later job: where a joiner stands then matters
    return [cycle.decide(p, cycle.class_of(p)) for p in order]


__all__ = ["head_of", "joiners_step"]
