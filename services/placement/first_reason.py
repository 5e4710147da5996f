"""When placement may say a job's first reason: only once the job has waited for GPUs past a grace.

Why: a job quota has just reserved often does not fit for a few milliseconds (the GPUs it needs
are still fenced: a GPU is free only once its node's agent reports the ending job's processes
gone) and is placed in the next cycle. A PlacementPending for that wait is an append, a relay
publish and deliveries for nothing anyone reads. So a job's first placement reason (it has none
recorded since quota reserved it) is held back until the job has waited `grace_seconds` since
placement learnt of the reservation; a job placed within it gets none. A job still unplaced then
has its reason said at once, with no event needed (`due_in` tells the service when to wake).
Meanwhile the log says the truth: quota reserved the job and placement has not decided yet
(`corral why` says so). A later reason of the job is the reason throttle's, not this.

The clock is placement's monotonic one (injected), so the rule is tested without waiting.
"""

from __future__ import annotations

from collections.abc import Callable, Container


class FirstReasonGrace:
    """Since when each job holding quota waits for placement; see the module docstring."""

    def __init__(self, monotonic: Callable[[], float], grace_seconds: float = 1.0) -> None:
        self.monotonic = monotonic
        self.grace_seconds = grace_seconds
        self._since: dict[str, float] = {}
        self._held: set[str] = set()  # jobs whose first reason was held back (to be said when due)

    def reserved(self, job_id: str) -> None:
        """Quota reserved `job_id` (folded now): its wait for placement starts now."""
        self._since[job_id] = self.monotonic()
        self._held.discard(job_id)

    def may_say(self, job_id: str) -> bool:
        """Whether a first reason of `job_id` may be said now; if not, it is remembered as held
        back (`due_in`, `due`). A job placement never saw reserved waits since now."""
        since = self._since.setdefault(job_id, self.monotonic())
        if self.monotonic() - since >= self.grace_seconds:
            self._held.discard(job_id)
            return True
        self._held.add(job_id)
        return False

    def due_in(self) -> float | None:
        """Seconds until the first held-back reason may be said (0: now); None: none held back."""
        if not self._held:
            return None
        now = self.monotonic()
        return max(0.0, min(self._since[j] for j in self._held) + self.grace_seconds - now)

    def due(self) -> set[str]:
        """The held-back jobs whose grace is over (the service decides them again)."""
        now = self.monotonic()
        return {j for j in self._held if now - self._since[j] >= self.grace_seconds}

    def forget(self, job_id: str) -> None:
        """`job_id` no longer waits for placement (placed, ended, quota given back)."""
        self._since.pop(job_id, None)
        self._held.discard(job_id)

    def retain(self, job_ids: Container[str]) -> None:
        """Forget every job not in `job_ids` (placed, ended, quota given back)."""
        self._since = {j: at for j, at in self._since.items() if j in job_ids}
        self._held = {j for j in self._held if j in job_ids}

    def __len__(self) -> int:
        return len(self._since)
