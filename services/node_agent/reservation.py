"""From a GangReserved event and the job's spec to what this node must run (an `Assignment`).

Why a pure module: the rank arithmetic (local rank, NODE_RANK) and the choice of command are the
agent's contract with torch.distributed and with placement; they are decided here without I/O,
so every node of a gang computes the same answer from the same event.

Attempts are counted from 0 (the first run) everywhere: events, `Assignment.attempt`, the stepd's
folders (`attempt-0`), `CORRAL_ATTEMPT` and the rank logs (files of step-file version 1, written
by agents that counted from 1, are read back into this numbering by `step_files`).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from corral.contracts.events import GangReserved
from corral.contracts.jobspec import JobSpec

from .process.assignment import Assignment, MountBind, RankAssignment, sim_command
from .process.run_as import WorkerUser

AgentRuntime = Literal["sim", "sim-timer", "process"]
"""`process`: each job runs as its spec says (spec.runtime). `sim`: every job is simulated, even a
`process` job (its command is never run), so a laptop can host a cluster running anyone's specs.
`sim-timer`: simulated like `sim`, but each gang is a timer inside the agent instead of one
process per rank (see `timer_supervisor`): for benchmarks that place hundreds of gangs a second."""

SIM_ARGS_ENV = "CORRAL_SIM_ARGS"
"""A job's env may set this to extra `corral.worker sim` options, e.g. "--fail-at-step 5"."""

DEFAULT_SIM_SECONDS = 60.0


@dataclass(frozen=True)
class LocalRanks:
    """This node's share of a gang: NODE_RANK and its ranks, local ranks by global rank order, and
    how many nodes the gang spans."""

    node_rank: int
    ranks: tuple[RankAssignment, ...]
    node_count: int = 1


def local_ranks(event: GangReserved, node: str) -> LocalRanks | None:
    """The ranks of `event` on `node`, or None when the gang has none here.

    NODE_RANK is the index of `node` among the gang's distinct nodes taken in rank order, so rank 0
    is always on NODE_RANK 0 (torchrun's convention: MASTER_ADDR is the node of rank 0).
    """
    ordered = sorted(event.ranks, key=lambda r: r.rank)
    nodes = list(dict.fromkeys(r.node for r in ordered))
    if node not in nodes:
        return None
    mine = [r for r in ordered if r.node == node]
    return LocalRanks(node_rank=nodes.index(node),
                      ranks=tuple(RankAssignment(r.rank, i, tuple(r.gpus)) for i, r in enumerate(mine)),
                      node_count=len(nodes))


def simulated(spec: JobSpec, runtime: AgentRuntime) -> bool:
    """Whether the job runs as the `sim` worker (a sim job, or an agent that simulates every job)."""
    return spec.runtime == "sim" or runtime != "process"


def job_command(spec: JobSpec, runtime: AgentRuntime, python: str) -> tuple[str, ...]:
    """What each rank executes: the spec's command, or the `sim` worker for simulated jobs.

    A container job may leave `command` out (the image's entrypoint runs): an empty tuple."""
    if not simulated(spec, runtime):
        if not spec.command and spec.image is None:
            raise ValueError(f"job spec: 'command' is required when runtime is {spec.runtime}")
        return tuple(spec.command or ())
    duration = spec.duration_seconds
    if duration is None:
        duration = spec.estimated_runtime_seconds or DEFAULT_SIM_SECONDS
    extra = shlex.split(spec.env.get(SIM_ARGS_ENV, ""))
    return sim_command(duration, python=python, extra=extra)


def resolve_mounts(spec: JobSpec, node: str, datasets: Mapping[str, str]) -> tuple[MountBind, ...]:
    """The spec's mounts with each dataset name replaced by its path on this node.

    Raises ValueError naming the mount, the node and the datasets it has when one is missing."""
    binds = []
    for i, mount in enumerate(spec.mounts):
        host = mount.source
        if mount.dataset is not None:
            if mount.dataset not in datasets:
                have = ", ".join(sorted(datasets)) or "none"
                raise ValueError(f"mounts[{i}]: dataset `{mount.dataset}` is not declared on node {node} "
                                 f"(it has: {have}); declare it in the cluster file's datasets")
            host = datasets[mount.dataset]
        binds.append(MountBind(host=host, target=mount.target, read_only=mount.read_only))
    return tuple(binds)


def build_assignment(event: GangReserved, node: str, spec: JobSpec, *, runtime: AgentRuntime,
                     python: str, checkpoint_root: Path, log_dir: Path,
                     user: WorkerUser | None = None, datasets: Mapping[str, str] | None = None,
                     ) -> Assignment | None:
    """The Assignment for `node`, or None when the gang has no rank here.

    `max_restarts` is 0 on purpose: a crash is reported, and placement (which sees every node)
    decides whether the whole gang restarts, so no agent restarts its share on its own. `user`: the
    OS account the ranks run as (None: the agent's own; see `run_as`). `datasets`: this node's
    datasets (name -> path), for the spec's mounts. The checkpoint folder is the spec's
    `checkpoint.dir`, else `<checkpoint_root>/<job>`. A simulated job runs as a plain process.
    Raises ValueError (naming the field) when the spec cannot run, e.g. env sets a reserved name.
    """
    share = local_ranks(event, node)
    if share is None:
        return None
    sim = simulated(spec, runtime)
    return Assignment(
        job_id=event.job_id,
        attempt=event.attempt,
        world_size=event.world_size,
        node_rank=share.node_rank,
        group_world_size=share.node_count,
        master_addr=event.master_addr,
        master_port=event.master_port,
        ranks=share.ranks,
        command=job_command(spec, runtime, python),
        checkpoint_dir=Path(spec.checkpoint.dir) if spec.checkpoint.dir else checkpoint_root / event.job_id,
        log_dir=log_dir,
        env=dict(spec.env),
        resume_from=Path(event.resume_from) if event.resume_from else None,
        checkpoint_signal=spec.checkpoint.signal,
        max_restarts=0,
        user=user,
        workdir=Path(spec.workdir) if spec.workdir and not sim else None,
        runtime="process" if sim else spec.runtime,
        image=None if sim else spec.image,
        mounts=() if sim else resolve_mounts(spec, node, datasets or {}),
        cpus=spec.cpus_per_replica,
        memory_gib=spec.memory_gib_per_replica,
        checkpoint_dir_from_spec=bool(spec.checkpoint.dir),
    )
