"""Submission limits per user: how many jobs one person may have waiting or running, and how fast
they may submit (admission's verdict, Slurm's MaxSubmitJobsPerUser and its RPC rate limiting).

Why: without them nothing stops one user: a burst of submissions is all accepted, and everyone's
`corral jobs` and every scheduling round pays for it. The rules, for the queues file's
`max_submitted_per_user` and `submit_rate_per_user`:
- a limit set on a queue counts the user's jobs in that queue and every queue below it; a
  submission must be within the limits of its queue and of every queue above it;
- a job counts from its submission until it ends (rejected, completed, failed or cancelled):
  pending, held and running jobs all count;
- the rate is a token bucket per (user, queue that sets it): `burst` tokens, refilled at
  `per_minute`; an admitted submission takes one token from each bucket on its path; a refused
  one takes none, and is told when the next token is there.

Deterministic: every time is the one the log recorded (a submission's receipt time), never a
clock read here, so folding the same log always gives the same ledger and the same verdicts.
A time that goes back (two admission processes with skewed clocks) refills nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = ["Bucket", "OverCount", "OverRate", "SubmitLedger", "UserLimits", "path_of", "refilled", "take"]


@dataclass(frozen=True, slots=True)
class UserLimits:
    """The per-user submission limits one queue sets (None: none of that kind)."""

    max_submitted: int | None = None
    rate_per_minute: float | None = None
    burst: int | None = None

    @property
    def any(self) -> bool:
        return self.max_submitted is not None or self.rate_per_minute is not None


@dataclass(frozen=True, slots=True)
class Bucket:
    """A token bucket: `tokens` as of `at` (seconds)."""

    tokens: float
    at: float


@dataclass(frozen=True, slots=True)
class OverCount:
    """The user already has `count` jobs counted against `queue`'s `limit`."""

    queue: str
    limit: int
    count: int


@dataclass(frozen=True, slots=True)
class OverRate:
    """`queue`'s bucket for the user is empty: a token is back after `retry_after` seconds."""

    queue: str
    per_minute: float
    burst: int
    retry_after: float


def path_of(queue: str) -> tuple[str, ...]:
    """The queue and every queue above it, leaf first: `a/b/c` -> (`a/b/c`, `a/b`, `a`)."""
    parts = queue.split("/")
    return tuple("/".join(parts[:n]) for n in range(len(parts), 0, -1))


def refilled(bucket: Bucket | None, now: float, per_minute: float, burst: int) -> float:
    """Tokens in the bucket at `now`: full when it never was used, never above `burst`."""
    if bucket is None:
        return float(burst)
    return min(float(burst), bucket.tokens + max(0.0, now - bucket.at) * per_minute / 60.0)


def take(bucket: Bucket | None, now: float, per_minute: float, burst: int) -> Bucket | float:
    """The bucket after taking one token at `now`, or the seconds until one is there."""
    tokens = refilled(bucket, now, per_minute, burst)
    if tokens >= 1.0:
        return Bucket(tokens - 1.0, max(now, bucket.at) if bucket is not None else now)
    return (1.0 - tokens) * 60.0 / per_minute


class SubmitLedger:
    """Each user's counted jobs and buckets, folded from the log (`submitted`, `ended`,
    `admitted`), and the verdict on a new submission (`refusal`). `scratch` gives a copy to judge
    several submissions with before any of them is in the log (a batch), each counted as judged."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}  # (user, queue) -> jobs counted in its subtree
        self.buckets: dict[tuple[str, str], Bucket] = {}  # (user, queue that sets a rate)
        self._counted: dict[str, tuple[str, str]] = {}  # job -> (user, leaf queue), until it ends

    def scratch(self) -> SubmitLedger:
        copy = SubmitLedger()
        copy.counts, copy.buckets = dict(self.counts), dict(self.buckets)
        return copy

    # ---- folding ------------------------------------------------------------------------------
    def submitted(self, job_id: str, user: str, queue: str) -> None:
        """A job in the log: it counts until it ends (once, however often it is folded)."""
        if job_id in self._counted:
            return
        self._counted[job_id] = (user, queue)
        self._count(user, queue, +1)

    def ended(self, job_id: str) -> None:
        counted = self._counted.pop(job_id, None)
        if counted is not None:
            self._count(*counted, -1)

    def admitted(self, user: str, queue: str, at: float, limits: Callable[[str], UserLimits | None]) -> None:
        """An admitted submission received at `at`: one token from each bucket on its path."""
        for q, lim in _limited(queue, limits):
            if lim.rate_per_minute is not None and lim.burst is not None:
                after = take(self.buckets.get((user, q)), at, lim.rate_per_minute, lim.burst)
                # a token that is not there (the limit was added or lowered since) is not owed
                self.buckets[(user, q)] = after if isinstance(after, Bucket) else Bucket(0.0, at)

    def _count(self, user: str, queue: str, delta: int) -> None:
        for q in path_of(queue):
            n = self.counts.get((user, q), 0) + delta
            if n:
                self.counts[(user, q)] = n
            else:
                self.counts.pop((user, q), None)

    # ---- the verdict --------------------------------------------------------------------------
    def refusal(self, user: str, queue: str, at: float,
                limits: Callable[[str], UserLimits | None]) -> OverCount | OverRate | None:
        """Why a submission of `user` to `queue` received at `at` is refused, or None: the count
        limits first (the nearest queue first), then the rates."""
        limited = list(_limited(queue, limits))
        for q, lim in limited:
            count = self.counts.get((user, q), 0)
            if lim.max_submitted is not None and count >= lim.max_submitted:
                return OverCount(q, lim.max_submitted, count)
        for q, lim in limited:
            if lim.rate_per_minute is not None and lim.burst is not None:
                after = take(self.buckets.get((user, q)), at, lim.rate_per_minute, lim.burst)
                if not isinstance(after, Bucket):
                    return OverRate(q, lim.rate_per_minute, lim.burst, after)
        return None


def _limited(queue: str, limits: Callable[[str], UserLimits | None]) -> Iterator[tuple[str, UserLimits]]:
    for q in path_of(queue):
        lim = limits(q)
        if lim is not None and lim.any:
            yield q, lim

