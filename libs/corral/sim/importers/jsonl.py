"""Corral's own workload format: one job spec per line plus `submit_at` and `duration_seconds`.

The job spec is exactly `corral.contracts.jobspec.JobSpec` (the schema `corral submit` and the
JobSubmitted contract use), so a workload line is a job file on one line. The simulator adds two
fields of its own: `submit_at` (seconds, required) and `checkpoint_interval_seconds` (how often the
job checkpoints by itself; default 1800). `runtime` defaults to `sim`, so `command` is optional,
and `duration_seconds` is required. The job id is the spec's `name`, which must be unique.

Blank lines and lines starting with `#` are skipped, so a workload file can carry comments.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from corral.contracts.jobspec import JobSpec, validate_job_spec
from corral.contracts.problems import SpecError
from corral.sim.workload import (
    DEFAULT_CHECKPOINT_INTERVAL_SECONDS,
    SimJob,
    Workload,
    WorkloadError,
    normalised,
)


def load_jsonl(path: Path) -> Workload:
    """Read a Corral JSONL workload; errors name the line, the field and what to write instead."""
    if not path.is_file():
        raise WorkloadError(f"workload {str(path)!r}: no such file; give a JSONL path or philly:/openb:FILE")
    jobs: list[SimJob] = []
    seen: set[str] = set()
    with path.open() as handle:
        for number, text in enumerate(handle, start=1):
            stripped = text.strip()
            if not stripped or stripped.startswith("#"):
                continue
            where = f"{path.name} line {number}"
            try:
                spec = json.loads(stripped)
            except json.JSONDecodeError as error:
                raise WorkloadError(f"{where}: not valid JSON ({error.msg}); write one JSON object per line") from error
            job = job_from_line(spec, where)
            if job.id in seen:
                raise WorkloadError(f"{where}: field 'name': {job.id!r} repeats an earlier job; names must be unique")
            seen.add(job.id)
            jobs.append(job)
    return normalised(jobs, f"jsonl:{path.name}", [])


def job_from_line(line: Any, where: str) -> SimJob:
    """One workload line (a JSON object) -> SimJob; public so tests and `--from-log` build jobs alike."""
    if not isinstance(line, dict):
        raise WorkloadError(f"{where}: expected a JSON object with a job spec, got {type(line).__name__}")
    fields = dict(line)
    submit_at = fields.pop("submit_at", None)
    interval = fields.pop("checkpoint_interval_seconds", DEFAULT_CHECKPOINT_INTERVAL_SECONDS)
    fields.setdefault("runtime", "sim")
    if submit_at is None:
        raise WorkloadError(f"{where}: field 'submit_at' is missing; add the submit time in seconds, e.g. 0")
    if isinstance(submit_at, bool) or not isinstance(submit_at, int | float) or submit_at < 0:
        raise WorkloadError(f"{where}: field 'submit_at' must be a number of seconds >= 0, got {submit_at!r}")
    if isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0:
        raise WorkloadError(
            f"{where}: field 'checkpoint_interval_seconds' must be a number of seconds > 0, got {interval!r}"
        )
    if fields.get("duration_seconds") is None:
        raise WorkloadError(f"{where}: field 'duration_seconds' is missing; add how long the job runs, e.g. 3600")
    try:
        spec = validate_job_spec(fields)
    except SpecError as error:
        raise WorkloadError(f"{where}: {error}") from error
    return job_from_spec(spec, float(submit_at), float(interval))


def job_from_spec(spec: JobSpec, submit_at: float, checkpoint_interval: float) -> SimJob:
    """A validated JobSpec at a submit time -> SimJob (the spec itself, as `corral submit` takes it)."""
    return SimJob(id=spec.name, submit=submit_at, duration=float(spec.duration_seconds or 0.0), spec=spec,
                  checkpoint_interval_seconds=checkpoint_interval)
