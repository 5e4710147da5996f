"""A submission whose spec breaks the JobSpec contract: refused with every problem, not dropped.

The problem: `corral validate` and `corral submit` check a spec against the contract before
sending it, but a pipeline that writes its own JSON does not; such a JobSubmitted did not decode,
so it was dead-lettered and its sender never got a verdict. Its envelope usually names the job,
so admission records a JobRejected on the job's stream naming each field and its fix (only the
rejection: the submission itself cannot be recorded, it is not a JobSubmitted).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from corral.contracts.jobspec import validate_job_spec
from corral.contracts.problems import Problem, SpecError

__all__ = ["invalid_submission"]

_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def invalid_submission(data: bytes) -> tuple[str, list[Problem]] | None:
    """(job id, the spec's problems with `spec.` paths) of an undecodable JobSubmitted whose job id
    is sound and whose spec is what is wrong; None for anything else (it is dead-lettered)."""
    try:
        doc: Any = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None
    if not isinstance(doc, dict) or doc.get("type") != "JobSubmitted":
        return None
    job_id = doc.get("job_id")
    if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
        return None
    try:
        validate_job_spec(doc.get("spec"))
    except SpecError as exc:
        return job_id, [Problem(path=f"spec.{p.path}" if p.path else "spec", message=p.message, hint=p.hint)
                        for p in exc.problems]
    return None
