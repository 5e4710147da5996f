"""Which waiting jobs the starvation limit has promoted (`levels.promote_at`), kept as time moves.

A `SchedulerState` keeps each queue's jobs sorted by their in-queue key, and the key of a job
passes its promotion time changes. The state is told the time by each cycle (`advance`): the jobs
whose promotion time has come since the last cycle are the ones to re-key, in O(log n) each, so
the kept order stays the one `levels.key_at(config, now)` gives from scratch. Time may also go
back (a caller may ask about an earlier moment): the jobs promoted after it are demoted again.
"""

from __future__ import annotations

import heapq
import math

from corral.core.levels import promote_at
from corral.core.model import PendingJob

# heap entries of jobs no longer waiting, beyond twice the waiting ones, before the heap is rebuilt
_SLACK = 64


class Promotions:
    """The waiting jobs with a promotion time, and those promoted at `clock`."""

    __slots__ = ("at", "clock", "due", "limit", "promoted")

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.at: dict[str, float] = {}  # waiting job -> when it is promoted (finite only)
        # heap of (promotion time, job) not yet promoted; a job that leaves stays in it until its
        # time comes or the heap is rebuilt (`remove`), so it holds at most about twice `at`
        self.due: list[tuple[float, str]] = []
        self.promoted: set[str] = set()
        self.clock = -math.inf

    def add(self, p: PendingJob) -> bool:
        """A job starts waiting: whether it is promoted at the current clock."""
        t = promote_at(p, self.limit)
        if t == math.inf:
            return False
        job_id = p.job.id
        self.at[job_id] = t
        if t <= self.clock:
            self.promoted.add(job_id)
            return True
        heapq.heappush(self.due, (t, job_id))
        return False

    def remove(self, job_id: str) -> None:
        self.at.pop(job_id, None)
        self.promoted.discard(job_id)
        if len(self.due) > 2 * len(self.at) + _SLACK:  # mostly left jobs' times: keep the waiting ones'
            self.due = [(t, i) for i, t in self.at.items() if i not in self.promoted]
            heapq.heapify(self.due)

    def advance(self, now: float) -> list[str]:
        """Move the clock to `now`: the jobs whose promotion changed (promoted or, when time went
        back, demoted), in a deterministic order."""
        changed: list[str] = []
        if now < self.clock:
            for job_id in sorted(i for i in self.promoted if self.at[i] > now):
                self.promoted.discard(job_id)
                heapq.heappush(self.due, (self.at[job_id], job_id))
                changed.append(job_id)
        self.clock = now
        due = self.due
        while due and due[0][0] <= now:
            t, job_id = heapq.heappop(due)
            if self.at.get(job_id) == t and job_id not in self.promoted:
                self.promoted.add(job_id)
                changed.append(job_id)
        return changed
