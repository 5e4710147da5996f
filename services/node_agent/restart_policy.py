"""Whether a crashed gang is launched again, and from where.

Why: a rank crash takes the whole gang down (the survivors would hang in their next collective).
The gang is restarted from its last checkpoint while restarts remain (`restart.max_restarts`), then
the job fails. Pure, so it can be decided identically by the agent and by the services that
orchestrate restarts across nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RestartGang:
    """Launch the gang again: attempt `attempt`, restart number `restarts`, resuming from `resume_from`
    (None: no checkpoint exists yet, start over)."""

    attempt: int
    restarts: int
    resume_from: Path | None


@dataclass(frozen=True)
class FailJob:
    """Give up: the reason code and a message for humans."""

    code: str
    message: str


RestartDecision = RestartGang | FailJob


def decide_restart(*, attempt: int, restarts: int, max_restarts: int, last_checkpoint: Path | None,
                   failed_rank: int, exit_code: int | None) -> RestartDecision:
    """Decide after a crash of `failed_rank` (exit code, or None when it could not start) on `attempt`.

    `restarts` is how many crash restarts were already used.
    """
    how = "could not start" if exit_code is None else f"exited with code {exit_code}"
    if restarts >= max_restarts:
        return FailJob(
            code="restarts_exhausted",
            message=f"rank {failed_rank} {how} on attempt {attempt}; "
                    f"{restarts} of max_restarts={max_restarts} restarts used",
        )
    return RestartGang(attempt=attempt + 1, restarts=restarts + 1, resume_from=last_checkpoint)
