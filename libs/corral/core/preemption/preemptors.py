"""Whether any waiting job could preempt at all: a necessary condition for a victim search.

Why: the victim search is a whole cycle over every waiting job, yet with a long backlog of jobs
that outrank no running job (the cluster full of their own queue's jobs, at their priority) it
finds nothing every time. The victim rule (`eligibility.victim_kind`) reads of a waiting job
only its queue, its priority, its attained service and (FAIR_LAS) when the starvation limit
promotes it, so `Preemptors` keeps those of every waiting job as a multiset, updated as jobs
come and go (O(what changed)), and `may_preempt` answers from per-queue aggregates and the
running jobs (O(running)) whether some waiting job might have a victim. False means no cycle
over these waiting jobs and running jobs yields a Preempt; True means only that one might (the
search decides).

Each clause is a superset of one of `victim_kind`'s answers, for some waiting job p and a
running job r that is `statically_eligible`:
- priority: r in p's queue with a strictly lower priority (the highest waiting one of the queue);
- LAS: r's attained service against the least of any waiting job (the rule is monotone in it);
- FAIR_LAS: r's level in p's queue (`levels.running_level`) above the lowest level of that queue's
  waiting jobs, 0 once one of them is promoted with `promotion_resets_level` (`levels.waiting_level`);
- reclaim, and a FAIR_LAS move (`eligibility.defragments`): r in a queue other than p's (the rest
  left to the search).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TypeVar

from corral.core.levels import level, running_level, starvation_limit
from corral.core.model import OrderPolicy, PendingJob, RunningJob, SchedulerConfig
from corral.core.preemption.eligibility import statically_eligible

T = TypeVar("T")
_Key = tuple[str, int, float, float | None, float]


class Preemptors:
    """The waiting jobs as the victim rule reads them: (queue, priority, attained service, requeue
    time, last run) by id."""

    def __init__(self, pending: Iterable[PendingJob] = ()) -> None:
        self._jobs: dict[str, _Key] = {}
        self._priorities: dict[str, Counter[int]] = {}
        self._attained: dict[str, Counter[float]] = {}
        self._runs: dict[str, Counter[tuple[float, float]]] = {}  # per queue: (requeue time, last run) if it ran
        self._top: dict[str, tuple[int, float]] = {}  # per queue: highest priority, least attained
        self._first: dict[str, tuple[float, float]] = {}  # per queue: (limit, its earliest promotion at that limit)
        for p in pending:
            self.put(p)

    def __len__(self) -> int:
        return len(self._jobs)

    def waiting(self) -> dict[str, _Key]:
        """What it holds: each waiting job's (queue, priority, attained service, requeue time, last run), by id."""
        return dict(self._jobs)

    def put(self, p: PendingJob) -> None:
        """`p` waits (again, or as it now is)."""
        key = (p.job.queue, p.job.priority, p.attained_gpu_seconds, p.requeued_at, p.last_run_seconds)
        if self._jobs.get(p.job.id) == key:
            return
        self.discard(p.job.id)
        self._jobs[p.job.id] = key
        queue, priority, attained, requeued, last_run = key
        self._priorities.setdefault(queue, Counter())[priority] += 1
        self._attained.setdefault(queue, Counter())[attained] += 1
        if requeued is not None and last_run > 0:
            self._runs.setdefault(queue, Counter())[(requeued, last_run)] += 1
        self._top.pop(queue, None)
        self._first.pop(queue, None)

    def discard(self, job_id: str) -> None:
        """`job_id` no longer waits (if it did)."""
        key = self._jobs.pop(job_id, None)
        if key is None:
            return
        queue, priority, attained, requeued, last_run = key
        _drop(self._priorities[queue], priority)
        _drop(self._attained[queue], attained)
        if not self._priorities[queue]:
            del self._priorities[queue], self._attained[queue]
        if requeued is not None and last_run > 0:
            _drop(self._runs[queue], (requeued, last_run))
            if not self._runs[queue]:
                del self._runs[queue]
        self._top.pop(queue, None)
        self._first.pop(queue, None)

    def _of(self, queue: str) -> tuple[int, float] | None:
        """The queue's highest waiting priority and least waiting attained service (None: no one waits)."""
        top = self._top.get(queue)
        if top is None and queue in self._priorities:
            top = self._top[queue] = (max(self._priorities[queue]), min(self._attained[queue]))
        return top

    def _promoted(self, queue: str, limit: float, now: float) -> bool:
        """Whether the starvation limit `limit` has promoted some waiting job of `queue` by `now`
        (`levels.promote_at`, the same sum)."""
        if limit <= 0 or queue not in self._runs:
            return False
        first = self._first.get(queue)
        if first is None or first[0] != limit:
            first = self._first[queue] = (limit, min(t + limit * run for t, run in self._runs[queue]))
        return now >= first[1]

    def may_preempt(self, running: Iterable[RunningJob], now: float, config: SchedulerConfig) -> bool:
        """Whether some waiting job might have a victim among `running` at `now` (module docstring)."""
        if not self._jobs or not (config.preemption or config.reclaim):
            return False
        las = config.preemption and config.order is OrderPolicy.LAS
        fair_las = config.preemption and config.order is OrderPolicy.FAIR_LAS
        moves = fair_las and config.defragment
        reclaim = config.reclaim and config.quotas
        queues = self._priorities.keys()
        least = min(top[1] for top in map(self._of, queues) if top is not None)
        ratio, gap, th = config.las_preemption_ratio, config.las_min_gap_gpu_seconds, config.las_thresholds
        limit = starvation_limit(config)
        for r in running:
            if not statically_eligible(r, now, config):
                continue
            if (reclaim or moves) and (len(queues) > 1 or r.job.queue not in queues):
                return True
            if las:
                theirs = r.attained(now)
                if ratio < 0 or (theirs >= ratio * least and theirs - least >= gap):
                    return True
            top = self._of(r.job.queue)
            if top is None:
                continue
            if config.preemption and r.job.priority < top[0]:
                return True
            if fair_las:
                reset = config.promotion_resets_level and self._promoted(r.job.queue, limit, now)
                floor = 0 if reset else level(top[1], th)
                if running_level(r, th, now) > floor:
                    return True
        return False


def _drop(counts: Counter[T], value: T) -> None:
    """One fewer `value` in `counts` (none left: not a key)."""
    counts[value] -= 1
    if not counts[value]:
        del counts[value]
