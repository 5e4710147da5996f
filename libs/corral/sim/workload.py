"""A workload for the simulator: jobs with a submit time and a true duration.

Why a separate type from `corral.core.Job`: the core must never see how long a job will really
run (only an optional estimate), while the simulator needs that hidden truth to generate
completions. Importers (JSONL, Philly, OpenB) all produce this one shape, and the engine turns
each `SimJob` into a core `Job` once, at load time.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

DEFAULT_CHECKPOINT_GRACE_SECONDS = 30.0
"""As in the job spec: a preempted job gets 30 s to checkpoint before its GPUs are taken back."""
DEFAULT_CHECKPOINT_INTERVAL_SECONDS = 1800.0
"""Jobs checkpoint every 30 minutes unless their spec says otherwise; preemption loses the work
done since the last periodic checkpoint."""


@dataclass(frozen=True, slots=True)
class TopologySpec:
    """Hard and soft topology of a job, as in the job spec: `replica` and `gang` are hard levels
    (`nvlink`, `node`, `rack`, `zone`), `prefer` is the soft level to pack at."""

    replica: str | None = None
    gang: str | None = None
    prefer: str | None = None


@dataclass(frozen=True, slots=True)
class SimJob:
    """One job of a workload. `submit` is seconds on the simulator clock (the first submission of
    the workload is 0); `duration` is how long it computes once started (not known to policies)."""

    id: str
    queue: str
    submit: float
    duration: float
    replicas: int = 1
    gpus_per_replica: int = 1
    priority: int = 0
    gpu_model: str | None = None
    gpu_min_memory_gib: float | None = None
    topology: TopologySpec = field(default_factory=TopologySpec)
    preemptible: bool = True
    checkpoint_grace_seconds: float = DEFAULT_CHECKPOINT_GRACE_SECONDS
    checkpoint_interval_seconds: float = DEFAULT_CHECKPOINT_INTERVAL_SECONDS
    min_runtime_seconds: float = 0.0
    estimated_runtime_seconds: float | None = None

    @property
    def gpus(self) -> int:
        return self.replicas * self.gpus_per_replica


class WorkloadError(ValueError):
    """A workload file that cannot be read; the message names the line, the field and the fix."""


@dataclass(frozen=True, slots=True)
class Workload:
    """Jobs sorted by submit time (ties keep file order), plus notes that every report repeats:
    how the source was mapped onto Corral's model (e.g. "a sharing task counts as one GPU")."""

    jobs: tuple[SimJob, ...]
    source: str
    notes: tuple[str, ...] = ()

    @property
    def queues(self) -> tuple[str, ...]:
        """Queue names in order of first appearance, so default shares are deterministic."""
        seen: dict[str, None] = {}
        for job in self.jobs:
            seen.setdefault(job.queue, None)
        return tuple(seen)

    def head(self, count: int) -> Workload:
        """The first `count` jobs: a slice for tests and quick looks."""
        return Workload(self.jobs[:count], f"{self.source}[:{count}]", self.notes)


def normalised(jobs: list[SimJob], source: str, notes: list[str]) -> Workload:
    """Sort by submit time (stable) and shift the clock so that the first submission is at 0."""
    ordered = sorted(jobs, key=lambda j: j.submit)
    if not ordered:
        return Workload((), source, tuple(notes))
    origin = ordered[0].submit
    if origin != 0:
        ordered = [_shifted(job, origin) for job in ordered]
    return Workload(tuple(ordered), source, tuple(notes))


def _shifted(job: SimJob, origin: float) -> SimJob:
    return replace(job, submit=job.submit - origin)
