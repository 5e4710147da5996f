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
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from corral.contracts.events import GangReserved
from corral.contracts.jobspec import JobSpec

from .assignment import Assignment, RankAssignment, sim_command
from .run_as import WorkerUser

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


def job_command(spec: JobSpec, runtime: AgentRuntime, python: str) -> tuple[str, ...]:
    """What each rank executes: the spec's command, or the `sim` worker for simulated jobs."""
    if spec.runtime == "process" and runtime == "process":
        if not spec.command:
            raise ValueError("job spec: 'command' is required when runtime is process")
        return tuple(spec.command)
    duration = spec.duration_seconds
    if duration is None:
        duration = spec.estimated_runtime_seconds or DEFAULT_SIM_SECONDS
    extra = shlex.split(spec.env.get(SIM_ARGS_ENV, ""))
    return sim_command(duration, python=python, extra=extra)


def build_assignment(event: GangReserved, node: str, spec: JobSpec, *, runtime: AgentRuntime,
                     python: str, checkpoint_root: Path, log_dir: Path,
                     user: WorkerUser | None = None) -> Assignment | None:
    """The Assignment for `node`, or None when the gang has no rank here.

    `max_restarts` is 0 on purpose: a crash is reported, and placement (which sees every node)
    decides whether the whole gang restarts, so no agent restarts its share on its own. `user`: the
    OS account the ranks run as (None: the agent's own; see `run_as`).
    Raises ValueError (naming the field) when the spec cannot run, e.g. env sets a reserved name.
    """
    share = local_ranks(event, node)
    if share is None:
        return None
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
        checkpoint_dir=checkpoint_root / event.job_id,
        log_dir=log_dir,
        env=dict(spec.env),
        resume_from=Path(event.resume_from) if event.resume_from else None,
        checkpoint_signal=spec.checkpoint.signal,
        max_restarts=0,
        user=user,
    )
