"""The codes of a gang's lifecycle and the worker exit codes, shared by every service.

Why here: placement, preemption, quota, the node agents, the CLI and the simulator all read the
reason codes of GangReleased / JobRequeued / JobFailed, and the worker exit codes are the
protocol between a job's processes and the agent. As bare strings and literals ("PREEMPTED",
"RESTARTING", `85` defined twice) a typo was a silent bug; as enums of the contracts it is an
import error. `Reason.code` stays a plain string on the wire (the schema is unchanged): these are
the values it takes for the lifecycle. The exit codes are defined with the rest of the worker
protocol (`corral.contracts.worker`) and re-exported here.

Attempts are numbered as the events number them everywhere (logs, CLI, messages): 0 for the
first run, +1 per requeue or restart.
"""

from __future__ import annotations

from enum import StrEnum

from corral.contracts.worker import WorkerExit  # the worker protocol's exit codes, re-exported here

__all__ = ["LifecycleCode", "WorkerExit"]


class LifecycleCode(StrEnum):
    """Why a gang was released (GangReleased), how its job goes on (JobRequeued, JobFailed)."""

    COMPLETED = "COMPLETED"            # every rank exited 0
    CHECKPOINTED = "CHECKPOINTED"      # every rank stopped by itself after a checkpoint (exit 85)
    PREEMPTED = "PREEMPTED"            # checkpointed and stopped for another job (preemption requeues)
    WORKER_FAILED = "WORKER_FAILED"    # a rank crashed, was killed, or could not start
    RESTARTING = "RESTARTING"          # JobRequeued after WORKER_FAILED: uses one of `restart.max_restarts`
    START_TIMEOUT = "START_TIMEOUT"    # not every rank started within the start barrier
    NODE_LOST = "NODE_LOST"            # a node of the gang stopped heartbeating
    WORKERS_LOST = "WORKERS_LOST"      # the node is alive but its agent no longer runs the gang
    PREEMPT_OVERRUN = "PREEMPT_OVERRUN"  # asked to checkpoint, not stopped long after its deadline
    CANCELLED = "CANCELLED"            # the user cancelled the job
    TIME_LIMIT = "TIME_LIMIT"          # the attempt ran longer than the spec's `time_limit` (fails, checkpoint kept)
    CLUSTER_RESTARTED = "CLUSTER_RESTARTED"  # the cluster was stopped under the gang (corral up)
    HELD = "HELD"                      # a pending job held by its owner or an admin (corral hold)
    REQUEUE_REQUESTED = "REQUEUE_REQUESTED"  # asked to checkpoint and wait again (corral requeue)
    NODE_DRAINED = "NODE_DRAINED"      # asked to checkpoint and move: its node is drained with --evict
    GPU_UNHEALTHY = "GPU_UNHEALTHY"    # a GPU of the gang went unhealthy (XID, ECC, fell off the bus)

    @property
    def uses_a_restart(self) -> bool:
        """Whether a JobRequeued with this code counts against `restart.max_restarts`: only the
        job's own crashes do; node loss, lost workers, timeouts and restarts of Corral do not."""
        return self is LifecycleCode.RESTARTING
