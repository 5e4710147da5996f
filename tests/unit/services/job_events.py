"""Events of one job as a test writes them: the job's stream, actor "test", correlated by job id."""

from __future__ import annotations

from typing import Any

from corral.contracts.envelope import job_stream


def job_event(job_id: str, cls: Any, **payload: Any) -> Any:
    """A `cls` event of job `job_id` with `payload`."""
    return cls.new(stream=job_stream(job_id), actor="test", correlation_id=job_id, job_id=job_id, **payload)
