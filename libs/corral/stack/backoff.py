"""When to restart a crashed child of `corral up`: exponential backoff, capped, forgiven when stable.

Why: during a Postgres outage placement crashed and was restarted 376 times with no pause, filling
its log and the CPU while nothing could succeed anyway. A child that dies is restarted after
`initial` seconds, then twice as long after each further death, at most `cap`; once it has run
for `stable_after` seconds the count is forgiven (a crash a day later restarts at once again).
Pure: the caller passes the clock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RestartBackoff:
    initial: float = 0.5
    factor: float = 2.0
    cap: float = 30.0
    stable_after: float = 60.0
    failures: int = 0
    started_at: float | None = None
    restart_at: float | None = None

    def started(self, now: float) -> None:
        """The child (re)started at `now`."""
        self.started_at, self.restart_at = now, None

    def exited(self, now: float) -> float:
        """The child was found dead at `now`: schedule its restart; returns the delay."""
        if self.started_at is not None and now - self.started_at >= self.stable_after:
            self.failures = 0
        delay = min(self.cap, self.initial * self.factor ** self.failures)
        self.failures += 1
        self.started_at, self.restart_at = None, now + delay
        return delay

    def due(self, now: float) -> bool:
        """A restart is scheduled and its time has come."""
        return self.restart_at is not None and now >= self.restart_at

    @property
    def waiting(self) -> bool:
        return self.restart_at is not None
