"""A workload for the simulator: job specs with a submit time and a true duration.

Why a separate type from `corral.core.Job`: the core must never see how long a job will really
run (only an optional estimate), while the simulator needs that hidden truth to generate
completions. Why it wraps a `JobSpec`: a replayed job must mean to the policy exactly what the
same job submitted with `corral submit` means, so the simulator takes the services' one
translation (`corral.translate.job_from_spec`) instead of copying a spec's fields into its own
(two translations disagreed once: one truncated `grace_seconds`, the other rounded it up).
Importers (JSONL, Philly, OpenB) all produce this one shape: JSONL lines are specs already;
traces build theirs with `sim_job`. The engine turns each `SimJob` into a core `Job` once, when it
arrives.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from corral.contracts.jobspec import Checkpoint, GpuRequest, JobSpec, Topology

DEFAULT_CHECKPOINT_GRACE_SECONDS = 30.0
"""As in the job spec: a preempted job gets 30 s to checkpoint before its GPUs are taken back."""
DEFAULT_CHECKPOINT_INTERVAL_SECONDS = 1800.0
"""Jobs checkpoint every 30 minutes unless their spec says otherwise; preemption loses the work
done since the last periodic checkpoint."""


@dataclass(frozen=True, slots=True)
class TopologySpec:
    """Hard and soft topology of a trace job, as in the job spec: `replica` and `gang` are hard
    levels (`nvlink`, `node`, `rack`, `zone`), `prefer` is the soft level to pack at. A trace job
    may leave `replica` unset (a replica's GPUs on any nodes), which a submitted spec cannot."""

    replica: str | None = None
    gang: str | None = None
    prefer: str | None = None


@dataclass(frozen=True, slots=True)
class SimJob:
    """One job of a workload: its `spec` (what was asked for) submitted at `submit` seconds on
    the simulator clock (the first submission of the workload is 0), with the truth the policy
    never sees: `duration`, how long it computes once started, and how often it checkpoints by
    itself (`checkpoint_interval_seconds`). The other attributes read the spec."""

    id: str
    submit: float
    duration: float
    spec: JobSpec
    checkpoint_interval_seconds: float = DEFAULT_CHECKPOINT_INTERVAL_SECONDS

    @property
    def queue(self) -> str:
        return self.spec.queue

    @property
    def replicas(self) -> int:
        return self.spec.replicas

    @property
    def gpus_per_replica(self) -> int:
        return self.spec.gpus_per_replica

    @property
    def gpus(self) -> int:
        return self.spec.replicas * self.spec.gpus_per_replica

    @property
    def priority(self) -> int:
        return int(self.spec.priority)

    @property
    def gpu_model(self) -> str | None:
        return self.spec.gpu.model if self.spec.gpu is not None else None

    @property
    def gpu_min_memory_gib(self) -> float | None:
        return self.spec.gpu.min_memory_gib if self.spec.gpu is not None else None

    @property
    def topology(self) -> Topology:
        return self.spec.topology

    @property
    def preemptible(self) -> bool:
        return self.spec.preemptible

    @property
    def checkpoint_grace_seconds(self) -> float:
        return self.spec.checkpoint.grace_seconds

    @property
    def min_runtime_seconds(self) -> float:
        return self.spec.min_runtime_seconds

    @property
    def estimated_runtime_seconds(self) -> float | None:
        return self.spec.estimated_runtime_seconds


def sim_job(
    id: str,
    queue: str,
    submit: float,
    duration: float,
    replicas: int = 1,
    gpus_per_replica: int = 1,
    *,
    priority: int = 0,
    gpu_model: str | None = None,
    gpu_min_memory_gib: float | None = None,
    topology: TopologySpec = TopologySpec(),
    preemptible: bool = True,
    checkpoint_grace_seconds: float = DEFAULT_CHECKPOINT_GRACE_SECONDS,
    checkpoint_interval_seconds: float = DEFAULT_CHECKPOINT_INTERVAL_SECONDS,
    min_runtime_seconds: float = 0.0,
    estimated_runtime_seconds: float | None = None,
) -> SimJob:
    """A trace's job as a spec (runtime `sim`, `duration_seconds` = its true duration) at its
    submit time. Fields a trace gives are taken as they are; the spec is not validated again (a
    trace's names and ids need not be valid job names)."""
    gpu = None
    if gpu_model is not None or gpu_min_memory_gib is not None:
        gpu = GpuRequest(model=gpu_model, min_memory_gib=gpu_min_memory_gib)
    spec = JobSpec(
        name=id, queue=queue, priority=priority, replicas=replicas, gpus_per_replica=gpus_per_replica, gpu=gpu,
        # a trace's levels are the core's names (may be None: no replica level, see the note above)
        topology=Topology(replica=topology.replica, gang=topology.gang,  # type: ignore[arg-type, unused-ignore]
                          prefer=topology.prefer),  # type: ignore[arg-type, unused-ignore]
        preemptible=preemptible, checkpoint=Checkpoint(grace_seconds=checkpoint_grace_seconds),
        min_runtime_seconds=min_runtime_seconds, estimated_runtime_seconds=estimated_runtime_seconds,
        runtime="sim", duration_seconds=duration,
    )
    return SimJob(id, submit, duration, spec, checkpoint_interval_seconds)


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
