"""A submission whose spec breaks the JobSpec contract: refused with every problem, not dropped.

`corral validate` and `corral submit` check a spec before sending it, but a pipeline that writes
its own JSON does not. Two kinds reach admission: a JobSubmitted that does not decode (its spec
breaks the schema), and one that decodes but asks for what the node agent would refuse to start
(`JobSpec.start_problems`: decoding leaves those rules out so a recorded spec always decodes).
Both are answered with a JobRejected (SPEC_INVALID) on the job's stream naming each field and its
fix; only the rejection is recorded, never the submission.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from corral.contracts.events import JobSubmitted
from corral.contracts.jobspec import JobSpec, validate_job_spec
from corral.contracts.problems import Problem, SpecError

__all__ = ["invalid_message", "invalid_submission", "start_problems"]

_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _in_spec(problems: list[Problem]) -> list[Problem]:
    return [Problem(path=f"spec.{p.path}" if p.path else "spec", message=p.message, hint=p.hint) for p in problems]


def invalid_submission(data: bytes) -> tuple[str, list[Problem]] | None:
    """(job id, the spec's problems with `spec.` paths) of an undecodable JobSubmitted whose job id
    is sound and whose spec is what is wrong; None for anything else (it is dead-lettered)."""
    try:
        doc: Any = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None
    if not isinstance(doc, dict) or doc.get("type") != JobSubmitted.type_name():
        return None
    job_id = doc.get("job_id")
    if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
        return None
    try:
        validate_job_spec(doc.get("spec"))
    except SpecError as exc:
        return job_id, _in_spec(exc.problems)
    return None


def start_problems(spec: JobSpec) -> list[Problem]:
    """What the node agent would refuse in a decoded submission's spec, with `spec.` paths."""
    return _in_spec(spec.start_problems())


def invalid_message(problems: list[Problem]) -> str:
    """The rejection's message: the first problems, each with its field."""
    said = "; ".join(f"{p.path}: {p.message}" for p in problems[:5])
    return f"the spec breaks the JobSpec contract: {said}"[:2000]
