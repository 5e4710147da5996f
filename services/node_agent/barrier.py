"""The gang start barrier: a gang is Running only when every rank started inside one window.

Why: a gang that is half started burns GPUs while its started ranks block in their first
collective. If a rank cannot start before the window closes, the whole gang is released so its
GPUs go back to the pool. Pure: times are arguments, so the decision is replayable from events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Waiting:
    """Some ranks have not reported yet and the window is still open."""

    missing: frozenset[int]
    deadline: float


@dataclass(frozen=True)
class GangRunning:
    """Every rank started inside the window; `running_at` is when the last one did."""

    running_at: float


@dataclass(frozen=True)
class ReleaseGang:
    """The window closed (or a rank failed to start): release the whole gang."""

    missing: frozenset[int]
    reason: str


BarrierVerdict = Waiting | GangRunning | ReleaseGang


@dataclass(frozen=True)
class GangStartBarrier:
    """Barrier state for one attempt of one gang; every update returns a new barrier."""

    expected: frozenset[int]
    opened_at: float
    window_seconds: float
    started: Mapping[int, float] = field(default_factory=dict)
    failed: Mapping[int, str] = field(default_factory=dict)

    @classmethod
    def open(cls, ranks: Iterable[int], opened_at: float, window_seconds: float) -> GangStartBarrier:
        expected = frozenset(ranks)
        if not expected:
            raise ValueError("gang start barrier: expected ranks is empty")
        if window_seconds <= 0:
            raise ValueError(f"gang start barrier: window_seconds must be > 0, got {window_seconds}")
        return cls(expected=expected, opened_at=opened_at, window_seconds=window_seconds)

    @property
    def deadline(self) -> float:
        return self.opened_at + self.window_seconds

    def with_started(self, rank: int, at: float) -> GangStartBarrier:
        """Record a WorkerStarted report. Unknown ranks are a bug in the caller. A repeat report
        keeps the first time."""
        if rank not in self.expected:
            raise ValueError(f"gang start barrier: rank {rank} is not one of {sorted(self.expected)}")
        if rank in self.started:
            return self
        return replace(self, started={**self.started, rank: at})

    def with_start_failed(self, rank: int, message: str) -> GangStartBarrier:
        """Record that a rank could not start at all: the gang will be released."""
        if rank not in self.expected:
            raise ValueError(f"gang start barrier: rank {rank} is not one of {sorted(self.expected)}")
        return replace(self, failed={**self.failed, rank: message})

    def decide(self, now: float) -> BarrierVerdict:
        """Running if every rank started by the deadline; Release if one failed or the deadline passed."""
        in_time = {r for r, at in self.started.items() if at <= self.deadline}
        missing = frozenset(self.expected - in_time)
        if self.failed:
            detail = "; ".join(f"rank {r}: {m}" for r, m in sorted(self.failed.items()))
            return ReleaseGang(missing=missing | frozenset(self.failed),
                               reason=f"rank could not start ({detail})")
        if not missing:
            return GangRunning(running_at=max(self.started[r] for r in self.expected))
        if now >= self.deadline:
            return ReleaseGang(missing=missing, reason=(
                f"{len(missing)} of {len(self.expected)} ranks did not start within "
                f"{self.window_seconds:g}s: {sorted(missing)}"))
        return Waiting(missing=missing, deadline=self.deadline)
