"""Microsoft Philly (ATC'19) job summary -> Workload.

Mapping (see the traces README): one job per row; queue = `cluster` (the virtual cluster, i.e.
the tenant); more than 8 GPUs is a gang of whole 8-GPU nodes (replicas = num_gpus / 8, 8 GPUs
each); up to 8 GPUs is one replica on one node. The trace has no priority, so every job gets 0.
A gang size that is not a multiple of 8 (12 GPUs, 7 jobs) becomes equal replicas of the largest
divisor up to 8 (2 x 6).
"""

from __future__ import annotations

import csv
from datetime import UTC, datetime
from pathlib import Path

from corral.sim.workload import SimJob, TopologySpec, Workload, WorkloadError, normalised, sim_job

GPUS_PER_NODE = 8
NODE_TOPOLOGY = TopologySpec(replica="node")
NOTES = (
    "Philly: queue = virtual cluster; jobs above 8 GPUs are gangs of whole 8-GPU nodes "
    "(replicas = GPUs/8, topology replica=node; a size not a multiple of 8, e.g. 12, is 2 replicas "
    "of 6); no priority in the trace (all 0); "
    "durations are the recorded run times, not known to policies",
)


def load_philly(path: Path) -> Workload:
    """Read the Philly CSV (`timestamp,duration,num_gpus,gpu_time,cluster`)."""
    if not path.is_file():
        raise WorkloadError(f"philly trace {str(path)!r}: no such file; pass philly:PATH_TO_CSV")
    jobs: list[SimJob] = []
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = {"timestamp", "duration", "num_gpus", "cluster"} - set(reader.fieldnames or ())
        if missing:
            raise WorkloadError(
                f"philly trace {str(path)!r}: missing column(s) {sorted(missing)}; "
                "expected timestamp,duration,num_gpus,gpu_time,cluster"
            )
        for line, row in enumerate(reader, start=2):
            jobs.append(_job(row, line, path))
    return normalised(jobs, f"philly:{path.name}", list(NOTES))


def _job(row: dict[str, str], line: int, path: Path) -> SimJob:
    try:
        submit = datetime.fromisoformat(row["timestamp"]).replace(tzinfo=UTC).timestamp()
        duration = float(row["duration"])
        gpus = int(row["num_gpus"])
    except ValueError as error:
        raise WorkloadError(f"philly trace {str(path)!r} line {line}: {error}") from error
    if gpus < 1:
        raise WorkloadError(f"philly trace {str(path)!r} line {line}: num_gpus must be >= 1, got {gpus}")
    per_replica = max(d for d in range(1, GPUS_PER_NODE + 1) if gpus % d == 0)
    replicas = gpus // per_replica
    return sim_job(
        id=f"philly-{line - 1:05d}",
        queue=row["cluster"],
        submit=submit,
        duration=max(duration, 0.0),
        replicas=replicas,
        gpus_per_replica=per_replica,
        topology=NODE_TOPOLOGY,
    )
