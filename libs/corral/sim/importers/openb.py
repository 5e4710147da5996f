"""Alibaba PAI OpenB (ATC'23, cluster-trace-gpu-v2023) -> Workload, plus the task list used by the
fill-the-cluster placement experiment.

Mapping (see the traces README): Corral allocates whole GPUs, so a GPU-sharing task
(`gpu_milli` < 1000) counts as one GPU; `gpu_spec` becomes a GPU model constraint; `qos` maps
to priority (LS and Guaranteed above Burstable above BE) and BE tasks are preemptible;
duration = `deletion_time - scheduled_time`, and a task still running when the trace ends runs to
the trace's end (its recorded deletion time). CPU-only tasks and tasks never scheduled in the trace
(no `scheduled_time`, hence no duration) are left out; the notes say how many.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from corral.sim.workload import SimJob, TopologySpec, Workload, WorkloadError, normalised, sim_job

QUEUE = "openb"
QOS_PRIORITY = {"LS": 900, "Guaranteed": 900, "Burstable": 500, "BE": 100}
"""The job spec's classes: LS/Guaranteed = high, Burstable = normal, BE = low."""
PREEMPTIBLE_QOS = frozenset({"BE"})
NODE_TOPOLOGY = TopologySpec(replica="node")


@dataclass(frozen=True, slots=True)
class OpenbTask:
    """A task as the fill experiment needs it: whole GPUs asked and the models it may use."""

    name: str
    gpus: int
    gpu_milli: int
    models: tuple[str, ...]


def read_tasks(path: Path) -> list[OpenbTask]:
    """Every GPU task of an OpenB pod list (with or without timestamps), in file order."""
    rows = _rows(path, {"name", "num_gpu", "gpu_milli"})
    tasks = []
    for _, row in rows:
        gpus = int(row["num_gpu"])
        if gpus < 1:
            continue
        models = tuple(m for m in (row.get("gpu_spec") or "").split("|") if m)
        tasks.append(OpenbTask(row["name"], gpus, int(row["gpu_milli"]), models))
    return tasks


def load_openb(path: Path) -> Workload:
    """Read an OpenB pod list with timestamps (e.g. `openb_pod_list_default.csv`)."""
    rows = _rows(path, {"name", "num_gpu", "gpu_milli", "qos", "creation_time", "deletion_time", "scheduled_time"})
    jobs: list[SimJob] = []
    cpu_only = never_scheduled = sharing = multi_model = 0
    for line, row in rows:
        gpus = int(row["num_gpu"])
        if gpus < 1:
            cpu_only += 1
            continue
        if not row["scheduled_time"]:
            never_scheduled += 1
            continue
        if int(row["gpu_milli"]) < 1000:
            sharing += 1
        qos = row["qos"]
        if qos not in QOS_PRIORITY:
            raise WorkloadError(
                f"openb trace {str(path)!r} line {line}: field 'qos' is {qos!r}; expected one of {sorted(QOS_PRIORITY)}"
            )
        models = [m for m in (row.get("gpu_spec") or "").split("|") if m]
        if len(models) > 1:
            multi_model += 1
        scheduled = float(row["scheduled_time"])
        jobs.append(
            sim_job(
                id=row["name"],
                queue=QUEUE,
                submit=float(row["creation_time"]),
                duration=max(float(row["deletion_time"]) - scheduled, 0.0),
                replicas=1,
                gpus_per_replica=gpus,
                priority=QOS_PRIORITY[qos],
                gpu_model=models[0] if len(models) == 1 else None,
                topology=NODE_TOPOLOGY,
                preemptible=qos in PREEMPTIBLE_QOS,
            )
        )
    notes = [
        "OpenB: a GPU-sharing task (gpu_milli < 1000) counts as one whole GPU "
        f"({sharing} tasks); qos -> priority LS/Guaranteed=900 (high), Burstable=500 (normal), "
        "BE=100 (low) (BE preemptible); "
        "duration = deletion_time - scheduled_time; tasks running when the trace ends run to its end",
        f"OpenB: left out {cpu_only} CPU-only tasks and {never_scheduled} tasks never scheduled in the "
        "trace (no duration)",
    ]
    if multi_model:
        notes.append(f"OpenB: {multi_model} tasks allow several GPU models; they run unconstrained")
    return normalised(jobs, f"openb:{path.name}", notes)


def _rows(path: Path, needed: set[str]) -> list[tuple[int, dict[str, str]]]:
    if not path.is_file():
        raise WorkloadError(f"openb trace {str(path)!r}: no such file; pass openb:PATH_TO_CSV")
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = needed - set(reader.fieldnames or ())
        if missing:
            raise WorkloadError(
                f"openb trace {str(path)!r}: missing column(s) {sorted(missing)}; a timed workload needs "
                "openb_pod_list_default.csv-style columns (creation_time, scheduled_time, deletion_time)"
            )
        return list(enumerate(reader, start=2))
