"""RunningIndex: what a cycle's victim search asks of all running jobs, kept between cycles.

Why: without an index, every cycle that looks for victims makes O(running) passes before it can
answer:
the running jobs sorted by id, the lowest priority running in each queue (outside LAS a
same-queue victim must rank lower), and under LAS the most attained service of any running job
(a waiting job that needs more than that finds no LAS victim) and, when some job does qualify,
the victims' whole cost order (every eligible running job costed and sorted) to keep those with
enough service. A replay changes one or two
running jobs between two cycles, so `SchedulerState` keeps these here, each change in O(log n)
(plus a list insert), and a cycle reads them in O(1) or O(distinct GPU counts).

The attained-service answer is an upper bound, not the exact maximum: attained service grows
with time (`attained(now) = attained + (now - start) x GPUs`), so for jobs of one GPU count g the
largest is the one with the largest `attained - start x g`; floating-point rounding makes that
key inexact, so a small margin is added. The reader uses it only to skip work that provably finds
nobody (`Candidates._las_may_find`), where a bound is as good as the maximum. The same sorted keys
give, for a threshold, the jobs that may reach it (a superset by the same margin), which the
reader checks exactly and costs: only those (`Candidates._las_kept`).
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort

from corral.core.model import RunningJob

# relative margin on the attained-service bound: far above float rounding (~1e-16 per operation)
_MARGIN = 1e-9


class RunningIndex:
    """Running jobs by id (`jobs`, sorted by id), their priorities per queue, and the keys of the
    attained-service bound per GPU count. Ids are unique (the owner checks)."""

    __slots__ = ("_by_id", "_ids", "_keys", "_prios", "_queue_keys", "_starts", "jobs")

    def __init__(self) -> None:
        self._ids: list[str] = []
        self.jobs: list[RunningJob] = []  # sorted by job id, parallel to `_ids`
        self._prios: dict[str, dict[int, int]] = {}  # queue -> priority -> running jobs
        self._by_id: dict[str, RunningJob] = {}
        # GPU count -> (`attained - start x GPUs`, job id), sorted: attained service order at any time
        self._keys: dict[int, list[tuple[float, str]]] = {}
        self._starts: list[float] = []  # sorted start times
        self._queue_keys: dict[str, dict[int, list[tuple[float, str]]]] = {}  # `_keys`, per queue

    def add(self, r: RunningJob) -> None:
        i = bisect_left(self._ids, r.job.id)
        self._ids.insert(i, r.job.id)
        self.jobs.insert(i, r)
        self._by_id[r.job.id] = r
        counts = self._prios.setdefault(r.job.queue, {})
        counts[r.job.priority] = counts.get(r.job.priority, 0) + 1
        self._time_add(r)

    def remove(self, r: RunningJob) -> None:
        i = bisect_left(self._ids, r.job.id)
        del self._ids[i]
        del self.jobs[i]
        del self._by_id[r.job.id]
        counts = self._prios[r.job.queue]
        left = counts[r.job.priority] - 1
        if left:
            counts[r.job.priority] = left
        else:
            del counts[r.job.priority]
            if not counts:
                del self._prios[r.job.queue]
        self._time_remove(r)

    def replace(self, old: RunningJob, r: RunningJob) -> None:
        """The same job (same id) with new facts; O(log n) when only those nothing here reads
        changed (asked to checkpoint, a checkpoint taken)."""
        if _facts(old) == _facts(r):
            self.jobs[bisect_left(self._ids, r.job.id)] = r
            self._by_id[r.job.id] = r
        else:
            self.remove(old)
            self.add(r)

    def copy(self) -> RunningIndex:
        """An independent index of the same jobs."""
        out = RunningIndex()
        out._ids, out.jobs, out._by_id, out._starts = self._ids.copy(), self.jobs.copy(), self._by_id.copy(), \
            self._starts.copy()
        out._prios = {q: counts.copy() for q, counts in self._prios.items()}
        out._keys = {g: keys.copy() for g, keys in self._keys.items()}
        out._queue_keys = {q: {g: keys.copy() for g, keys in mine.items()} for q, mine in self._queue_keys.items()}
        return out

    def lowest_priority(self) -> dict[str, int]:
        """Per queue: the lowest priority of its running jobs."""
        return {q: min(counts) for q, counts in self._prios.items()}

    def most_attained_bound(self, now: float, queue: str | None = None) -> float | None:
        """At least the most attained service of any running job at `now` (of `queue`, when
        named; -inf when none runs); None when some job starts after `now` (its service is not
        growing yet: ask each job)."""
        if not self._starts:
            return -math.inf
        if self._starts[-1] > now:
            return None
        span = abs(now) + max(abs(self._starts[0]), abs(self._starts[-1]))
        best = -math.inf
        for g, keys in (self._keys if queue is None else self._queue_keys.get(queue, {})).items():
            top = keys[-1][0]
            best = max(best, top + now * g + _MARGIN * (1.0 + abs(top) + span * g))
        return best

    def attained_at_least(self, need: float, now: float) -> list[RunningJob] | None:
        """Running jobs that may have `need` attained service at `now`: a superset of those that
        have it (the margin covers rounding; the caller checks each exactly), in no useful order.
        None when some job starts after `now`."""
        if self._starts and self._starts[-1] > now:
            return None
        out: list[RunningJob] = []
        if not self._starts:
            return out
        span = abs(now) + max(abs(self._starts[0]), abs(self._starts[-1]))
        by_id = self._by_id
        for g, keys in self._keys.items():
            scale = max(abs(keys[0][0]), abs(keys[-1][0]))
            slack = 2 * _MARGIN * (1.0 + abs(need) + scale + span * g)
            i = bisect_left(keys, (need - now * g - slack,))  # the first key at least that
            out.extend(by_id[job_id] for _, job_id in keys[i:])
        return out

    def _time_add(self, r: RunningJob) -> None:
        g = r.job.total_gpus
        key = (r.attained_gpu_seconds - r.start_time * g, r.job.id)
        insort(self._keys.setdefault(g, []), key)
        insort(self._queue_keys.setdefault(r.job.queue, {}).setdefault(g, []), key)
        insort(self._starts, r.start_time)

    def _time_remove(self, r: RunningJob) -> None:
        g = r.job.total_gpus
        keys = self._keys[g]
        key = (r.attained_gpu_seconds - r.start_time * g, r.job.id)
        del keys[bisect_left(keys, key)]
        if not keys:
            del self._keys[g]
        mine = self._queue_keys[r.job.queue]
        keys = mine[g]
        del keys[bisect_left(keys, key)]
        if not keys:
            del mine[g]
            if not mine:
                del self._queue_keys[r.job.queue]
        del self._starts[bisect_left(self._starts, r.start_time)]


def _facts(r: RunningJob) -> tuple[object, ...]:
    return (r.job.queue, r.job.priority, r.job.total_gpus, r.attained_gpu_seconds, r.start_time)
