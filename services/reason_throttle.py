"""When a waiting job's reason is worth a PlacementPending: the one throttle for every service.

Why: quota and placement both explain waiting jobs, and every reservation changes the numbers in
many reasons ("uses 117 of max 120 GPUs" -> "119 of 120"); written each time, they would take the
log's capacity. One rule, for both services:
- a reason whose code differs from the job's recorded one is news at once;
- the same code and message is never news;
- the same code with a new message is news at most every `refresh_seconds` per job.
The clock is the service's (injected), so the rule is tested without waiting.
"""

from __future__ import annotations

from collections.abc import Callable, Container

from corral.contracts.envelope import Reason as WireReason


class ReasonThrottle:
    """Remembers when each job's reason was last said; see the module docstring."""

    def __init__(self, monotonic: Callable[[], float], refresh_seconds: float = 5.0) -> None:
        self.monotonic = monotonic
        self.refresh_seconds = refresh_seconds
        self._said: dict[str, float] = {}

    def news(self, job_id: str, recorded: WireReason | None, code: str, message: str) -> bool:
        """Whether (code, message) for `job_id`, whose log says `recorded`, is worth writing now;
        if so, it counts as said now."""
        if recorded is not None and recorded.code == code:
            if recorded.message == message:
                return False  # said, word for word: no clock read (most of a backlog, every round)
            now = self.monotonic()
            said = self._said.get(job_id)
            if said is not None and now - said < self.refresh_seconds:
                return False
        else:
            now = self.monotonic()
        self._said[job_id] = now
        return True

    def retain(self, job_ids: Container[str]) -> None:
        """Forget every job not in `job_ids` (jobs that ended: keeps the memory bounded)."""
        self._said = {job_id: at for job_id, at in self._said.items() if job_id in job_ids}

    def __len__(self) -> int:
        return len(self._said)
