"""Which jobs a listing (`corral jobs`) shows, and in what order: pure, so the read model's SQL
(`snapshots.read_page`) and a view already in memory (the gateway's) answer alike."""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corral.projection import JobView


@dataclass(frozen=True)
class JobFilter:
    """The jobs of `queue` (and its children), of `user`, in `states` (else the jobs not over, or
    every one with `all_jobs`)."""

    queue: str | None = None
    user: str | None = None
    states: Collection[str] | None = None
    all_jobs: bool = False

    def matches(self, job: JobView) -> bool:
        if self.queue and not (job.queue == self.queue or job.queue.startswith(self.queue + "/")):
            return False
        if self.user and job.user != self.user:
            return False
        if self.states is not None:
            return job.state.value in self.states
        return self.all_jobs or not job.state.terminal


def selected(jobs: Iterable[JobView], where: JobFilter) -> list[JobView]:
    """The jobs of `jobs` that `where` matches, in their order."""
    return [j for j in jobs if where.matches(j)]


#: Where a job whose submission is not folded yet sorts: last.
_NEVER = datetime.max.replace(tzinfo=UTC)


def _submission_key(j: JobView) -> tuple[datetime, str]:
    return (j.submitted_at or _NEVER, j.job_id)


def first_by_submission(jobs: Sequence[JobView], n: int | None) -> list[JobView]:
    """The `n` oldest of `jobs` by submission (then id), in that order (None: all of them): only
    those are sorted."""
    if n is not None and n < len(jobs):
        return heapq.nsmallest(n, jobs, key=_submission_key)
    return sorted(jobs, key=_submission_key)


def page_of(jobs: Iterable[JobView], where: JobFilter, limit: int | None) -> tuple[list[JobView], int]:
    """The first `limit` of `jobs` that `where` matches (None: every one), and how many match."""
    matching = selected(jobs, where)
    return first_by_submission(matching, limit), len(matching)
