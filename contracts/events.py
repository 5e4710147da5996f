"""Every event of Corral. Envelope fields come from `Event`; payloads are listed here.

Flow (see docs/architecture.md): JobSubmitted -> JobAdmitted | JobRejected -> QuotaReserved ->
GangReserved | PlacementPending -> WorkerStarted x N -> JobRunning -> WorkerExited ->
JobCompleted | JobFailed. Preemption: PreemptRequested -> CheckpointDone -> GangReleased ->
JobRequeued. Nodes: NodeRegistered, NodeHeartbeat, NodeLost, NodeConditionsChanged (disk or memory
pressure, measured by the node's agent), GpuHealthChanged (GPUs its agent finds unhealthy through
NVML), GpuDrained / GpuUndrained (an admin's); GpusAllocated / GpusReleased are
each node's allocation ledger. Queues: QueueTreeApplied (a numbered version of the whole tree),
QueueConfigured (one queue), QueueChangeRefused (the evidence gate said no). Policy: PolicyInForce
(the scheduling policy quota, placement and preemption decide by). Escalation:
WaitExceeded (a job waited longer than its queue's `max_wait`). People: UserAdded, UserRemoved,
UserCredentialsRotated (stream `people`, recorded by `corral user`).

Each class declares its `flow` once (`corral.contracts.flow`): its writers, its stream, the
senders that may send it to the inbox and the processes sent it; subjects, permissions and the
services' consumers derive from it.

Expected outcomes that are not successes carry a `Reason` (code, message with numbers, details).

Versions: every event is v1 but JobSubmitted v2 (its spec gained image, mounts, workdir, time_limit,
cpus/memory per replica, checkpoint.dir and more runtimes), NodeRegistered v2 (cpus, host
memory, datasets), PreemptRequested v2 (no `for_job_id`) and QueueTreeApplied v2 (gates).
`UPCASTERS` lift the v1 documents still in the log: every field they add has a default that means
what v1 meant (no image, no mounts, the agent's folder, no limit, no gate).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

import msgspec

from corral.contracts.cluster import Datasets, GpuDevice, GpuIndex, Location, NodeName
from corral.contracts.envelope import Event, Reason, UtcDatetime
from corral.contracts.flow import (
    ADMIN_CLI,
    ADMISSION,
    NODE_AGENT,
    PLACEMENT,
    PREEMPTION,
    QUOTA,
    RELAY,
    Flow,
)
from corral.contracts.jobspec import JobSpec, QueuePath, Signal
from corral.contracts.problems import Problem
from corral.contracts.queues import QueueSpec

__all__ = [
    "ALL_EVENTS",
    "CheckpointDone",
    "EventNotRelayed",
    "GangReleased",
    "GangReserved",
    "GateCheck",
    "GpuDrained",
    "GpuHealthChanged",
    "GpuProblem",
    "GpuUndrained",
    "GpusAllocated",
    "GpusReleased",
    "JobAdmitted",
    "JobCancelRequested",
    "JobCancelled",
    "JobCompleted",
    "JobFailed",
    "JobHeld",
    "JobHoldReleased",
    "JobRejected",
    "JobRequeueRequested",
    "JobRequeued",
    "JobRunning",
    "JobSubmitted",
    "NodeCondition",
    "NodeConditionsChanged",
    "NodeDrained",
    "NodeHeartbeat",
    "NodeLost",
    "NodeRegistered",
    "NodeUndrained",
    "PlacementPending",
    "PolicyInForce",
    "PortRange",
    "PreemptRequested",
    "QueueChangeRefused",
    "QueueConfigured",
    "QueueTreeApplied",
    "QuotaReleased",
    "QuotaReserved",
    "RankPlacement",
    "UserAdded",
    "UserCredentialsRotated",
    "UserRemoved",
    "WaitExceeded",
    "WorkerExited",
    "WorkerStarted",
]

JobId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$",
                                    description="job id; a ULID when Corral assigns it")]
Attempt = Annotated[int, msgspec.Meta(ge=0, description="0 for the first run, +1 per requeue/restart")]
Rank = Annotated[int, msgspec.Meta(ge=0)]
Gpus = Annotated[int, msgspec.Meta(ge=0)]
Port = Annotated[int, msgspec.Meta(ge=1, le=65535)]
Address = Annotated[str, msgspec.Meta(
    min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9.:-]*$",
    description="an IPv4/IPv6 address or a DNS name other hosts reach this node at")]


class PortRange(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The TCP ports `low`..`high` (inclusive) a node lends to rendezvous (`MASTER_PORT`)."""

    low: Port
    high: Port

    def __post_init__(self) -> None:
        if self.high < self.low:
            raise ValueError(f"port range: high {self.high} is below low {self.low}; give low <= high")


class RankPlacement(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where one rank of a gang runs: its node and the GPU indices on that node."""

    rank: Rank
    node: NodeName
    gpus: list[GpuIndex]


# --- job lifecycle -------------------------------------------------------------------------


class JobSubmitted(Event, frozen=True, kw_only=True, tag="JobSubmitted"):
    """A user or pipeline asks for a job; published to the inbox, appended by admission."""
    flow: ClassVar[Flow] = Flow(
        writers=(ADMISSION,), stream="job", inbox=("user",),
        consumers=(ADMISSION, QUOTA, PREEMPTION, PLACEMENT, NODE_AGENT))


    schema_version: int = 2
    job_id: JobId
    spec: JobSpec
    submission_id: str | None = None
    user: str | None = None


class JobCancelRequested(Event, frozen=True, kw_only=True):
    """A user asks to cancel a job; published to the inbox."""
    flow: ClassVar[Flow] = Flow(
        writers=(ADMISSION,), stream="job", inbox=("user", "admin"), consumers=(QUOTA, PREEMPTION, PLACEMENT))


    job_id: JobId
    user: str | None = None
    message: str = ""


class JobHeld(Event, frozen=True, kw_only=True):
    """A pending job kept from running until released (Slurm's `scontrol hold`); sent to the inbox
    by its owner or an admin, recorded by admission on the job's stream. Quota it held is given
    back. Only a waiting job can be held: a running one is requeued or cancelled instead."""
    flow: ClassVar[Flow] = Flow(
        writers=(ADMISSION,), stream="job", inbox=("user", "admin"), consumers=(QUOTA, PREEMPTION, PLACEMENT))


    job_id: JobId
    user: str | None = None
    message: str = ""


class JobHoldReleased(Event, frozen=True, kw_only=True):
    """A held job waits again (`corral release`), recorded by admission like JobHeld."""
    flow: ClassVar[Flow] = Flow(
        writers=(ADMISSION,), stream="job", inbox=("user", "admin"), consumers=(QUOTA, PREEMPTION, PLACEMENT))


    job_id: JobId
    user: str | None = None
    message: str = ""


class JobRequeueRequested(Event, frozen=True, kw_only=True):
    """Stop a running job at a checkpoint and let it wait again (Slurm's `scontrol requeue`): sent
    by its owner or an admin, recorded by admission; preemption then asks it to checkpoint
    (PreemptRequested without `for_job_id`) and requeues it as for any preemption."""
    flow: ClassVar[Flow] = Flow(
        writers=(ADMISSION,), stream="job", inbox=("user", "admin"), consumers=(QUOTA, PREEMPTION, PLACEMENT))


    job_id: JobId
    user: str | None = None
    message: str = ""


class JobAdmitted(Event, frozen=True, kw_only=True):
    """Admission accepted the spec; the denormalised numbers spare consumers a lookup."""
    flow: ClassVar[Flow] = Flow(writers=(ADMISSION,), stream="job", consumers=(ADMISSION, QUOTA, PREEMPTION, PLACEMENT))


    job_id: JobId
    queue: QueuePath
    priority: int
    replicas: Annotated[int, msgspec.Meta(ge=1)]
    gpus_per_replica: Annotated[int, msgspec.Meta(ge=1)]


class JobRejected(Event, frozen=True, kw_only=True):
    """Admission refused the job; `problems` name the fields (empty for non-field reasons)."""
    flow: ClassVar[Flow] = Flow(
        writers=(ADMISSION,), stream="job", consumers=(ADMISSION, QUOTA, PREEMPTION, PLACEMENT, NODE_AGENT))


    job_id: JobId
    reason: Reason
    problems: list[Problem] = msgspec.field(default_factory=list)


class QuotaReserved(Event, frozen=True, kw_only=True):
    """Quota set aside for a job; `borrowed` is how many of `gpus` come from siblings' guarantees."""
    # Not sent to preemption: its victim search runs the whole cycle over every waiting job, quota or not.
    flow: ClassVar[Flow] = Flow(writers=(QUOTA,), stream="job", consumers=(PLACEMENT,))


    job_id: JobId
    queue: QueuePath
    gpus: Gpus
    borrowed: Gpus = 0


class QuotaReleased(Event, frozen=True, kw_only=True):
    flow: ClassVar[Flow] = Flow(writers=(QUOTA,), stream="job", consumers=(PLACEMENT,))
    job_id: JobId
    queue: QueuePath
    gpus: Gpus
    reason: Reason


class GangReserved(Event, frozen=True, kw_only=True):
    """Placement's decision: every rank's node and GPUs, all at once (all-or-nothing).

    `master_addr` is the address rank 0's node registered; `master_port` a port of that node's
    rendezvous range no other live gang holds on that address (see `corral.core.rendezvous`)."""
    flow: ClassVar[Flow] = Flow(writers=(PLACEMENT,), stream="job", consumers=(QUOTA, PREEMPTION, NODE_AGENT))


    job_id: JobId
    ranks: Annotated[list[RankPlacement], msgspec.Meta(min_length=1)]
    world_size: Annotated[int, msgspec.Meta(ge=1)]
    master_addr: str
    master_port: Port
    attempt: Attempt = 0
    resume_from: str | None = None


class PlacementPending(Event, frozen=True, kw_only=True):
    """The job waits; emitted only when the reason changes (codes: GANG_DOES_NOT_FIT, ...)."""
    # Quota and placement each say a waiting job's reason only when it is news against the one the
    # log holds, so each is sent the other's; preemption reads no waiting job's reason.
    flow: ClassVar[Flow] = Flow(writers=(PLACEMENT, QUOTA), stream="job", consumers=(QUOTA, PLACEMENT))


    job_id: JobId
    reason: Reason


class WaitExceeded(Event, frozen=True, kw_only=True):
    """The job has waited longer than `max_wait_seconds`, the `max_wait` of `limit_queue` (its own
    queue, or the nearest queue above it that sets one), in its current wait: since it was admitted,
    requeued, or released from a hold (`waiting_since`). Recorded by quota on the job's stream, once
    per wait (a requeued job waits anew). `blocker` is the reason it waits with at that moment (None:
    no reason recorded yet); `corral jobs --stuck` lists such jobs, `corral why` shows the step."""
    flow: ClassVar[Flow] = Flow(writers=(QUOTA,), stream="job", consumers=(PREEMPTION, PLACEMENT))


    job_id: JobId
    queue: QueuePath
    limit_queue: QueuePath
    attempt: Attempt
    waiting_since: UtcDatetime
    max_wait_seconds: Annotated[float, msgspec.Meta(gt=0)]
    waited_seconds: Annotated[float, msgspec.Meta(ge=0)]
    blocker: Reason | None = None


class PreemptRequested(Event, frozen=True, kw_only=True, tag="PreemptRequested"):
    """The victim must checkpoint (send `signal`) and stop by `deadline`, then waits again: to make
    room for `for_job_id`, or (v2: `for_job_id` None) because an operator asked (`corral requeue`,
    `corral drain --evict`; `reason` says which and who).

    v2: `for_job_id` may be None (v1 always named a job; `UPCASTERS`)."""
    flow: ClassVar[Flow] = Flow(
        writers=(PREEMPTION,), stream="job", consumers=(QUOTA, PREEMPTION, PLACEMENT, NODE_AGENT))


    schema_version: int = 2
    victim_job_id: JobId
    for_job_id: JobId | None = None
    deadline: UtcDatetime
    signal: Signal = "SIGUSR1"
    reason: Reason


class CheckpointDone(Event, frozen=True, kw_only=True):
    """A worker reported a checkpoint at `path` (what `CORRAL_RESUME_FROM` will point to)."""
    flow: ClassVar[Flow] = Flow(writers=(PLACEMENT,), stream="job", inbox=("node",), consumers=(QUOTA, PREEMPTION))


    job_id: JobId
    path: str
    step: int | None = None
    rank: Rank | None = None
    attempt: Attempt = 0


class GangReleased(Event, frozen=True, kw_only=True):
    """The job's GPUs are free again (preempted, finished, failed, node lost, start timeout)."""
    flow: ClassVar[Flow] = Flow(writers=(PLACEMENT,), stream="job", consumers=(QUOTA, PREEMPTION, NODE_AGENT))


    job_id: JobId
    reason: Reason
    attempt: Attempt = 0


class JobRequeued(Event, frozen=True, kw_only=True):
    """The job waits again; its next attempt resumes from `resume_from` (None: start over)."""
    flow: ClassVar[Flow] = Flow(
        writers=(PLACEMENT, PREEMPTION), stream="job", consumers=(QUOTA, PREEMPTION, PLACEMENT, NODE_AGENT))


    job_id: JobId
    resume_from: str | None = None
    reason: Reason
    attempt: Attempt  # the number of the attempt that will run next


class WorkerStarted(Event, frozen=True, kw_only=True):
    flow: ClassVar[Flow] = Flow(writers=(PLACEMENT,), stream="job", inbox=("node",))
    job_id: JobId
    rank: Rank
    node: NodeName
    pid: Annotated[int, msgspec.Meta(ge=0)]
    attempt: Attempt = 0


class WorkerExited(Event, frozen=True, kw_only=True):
    """`exit_code` None: killed by a signal (named in `reason.details["signal"]`)."""
    flow: ClassVar[Flow] = Flow(writers=(PLACEMENT,), stream="job", inbox=("node",))


    job_id: JobId
    rank: Rank
    node: NodeName
    exit_code: int | None
    attempt: Attempt = 0
    reason: Reason


class JobRunning(Event, frozen=True, kw_only=True):
    """Every rank of the attempt started (the gang start barrier passed)."""
    flow: ClassVar[Flow] = Flow(writers=(PLACEMENT,), stream="job", consumers=(QUOTA, PREEMPTION))


    job_id: JobId
    attempt: Attempt = 0


class JobCompleted(Event, frozen=True, kw_only=True):
    flow: ClassVar[Flow] = Flow(
        writers=(PLACEMENT,), stream="job", consumers=(ADMISSION, QUOTA, PREEMPTION, NODE_AGENT))
    job_id: JobId
    attempt: Attempt = 0


class JobFailed(Event, frozen=True, kw_only=True):
    flow: ClassVar[Flow] = Flow(
        writers=(PLACEMENT,), stream="job", consumers=(ADMISSION, QUOTA, PREEMPTION, NODE_AGENT))
    job_id: JobId
    reason: Reason
    attempt: Attempt = 0


class JobCancelled(Event, frozen=True, kw_only=True):
    flow: ClassVar[Flow] = Flow(
        writers=(ADMISSION,), stream="job", consumers=(ADMISSION, QUOTA, PREEMPTION, PLACEMENT, NODE_AGENT))
    job_id: JobId
    reason: Reason


# --- nodes ---------------------------------------------------------------------------------


class GpusAllocated(Event, frozen=True, kw_only=True):
    """The node's share of a GangReserved, on stream `node-<name>`: the node's allocation ledger.

    Appended in the same transaction as the GangReserved, with the node stream's expected
    version, so a decision taken on a stale view of the node is refused; a database trigger
    mirrors it into the `allocations` table whose unique index refuses a GPU held twice.
    """
    flow: ClassVar[Flow] = Flow(writers=(PLACEMENT,), stream="node")


    node: NodeName
    job_id: JobId
    gpus: Annotated[list[GpuIndex], msgspec.Meta(min_length=1)]
    attempt: Attempt = 0


class GpusReleased(Event, frozen=True, kw_only=True):
    """The node's share of a GangReleased, on stream `node-<name>`."""
    # Sent to no service: placement writes it; quota and preemption keep no GPU ledger
    # (`ClusterView.gpu_ledger`).
    flow: ClassVar[Flow] = Flow(writers=(PLACEMENT,), stream="node")


    node: NodeName
    job_id: JobId
    gpus: list[GpuIndex]
    attempt: Attempt = 0


class NodeRegistered(Event, frozen=True, kw_only=True, tag="NodeRegistered"):
    """A node agent's inventory: every GPU, NVLink domains covering all GPUs, rack and zone."""
    flow: ClassVar[Flow] = Flow(
        writers=(PLACEMENT,), stream="node", inbox=("node",), consumers=(ADMISSION, QUOTA, PREEMPTION))


    schema_version: int = 2
    node: NodeName
    gpus: list[GpuDevice]
    nvlink_domains: list[list[GpuIndex]]
    rack: Location
    zone: Location
    #: Where other hosts reach this node: rank 0's node address is a gang's `MASTER_ADDR`. None
    #: (an agent that does not say, simulated nodes): placement uses `CORRAL_MASTER_ADDR` (127.0.0.1).
    address: Address | None = None
    #: The ports placement may give a gang whose rank 0 runs here as `MASTER_PORT`; None: the
    #: default range (`corral.core.rendezvous.DEFAULT_PORT_RANGE`).
    rendezvous_ports: PortRange | None = None
    #: The node's CPU cores and host memory (None: not declared) and the datasets it holds, name ->
    #: path on this node (the cluster file's shared ones included). Since v2.
    cpus: Annotated[int, msgspec.Meta(ge=1)] | None = None
    host_memory_gib: Annotated[float, msgspec.Meta(gt=0)] | None = None
    datasets: Datasets = msgspec.field(default_factory=dict)


class NodeHeartbeat(Event, frozen=True, kw_only=True):
    """`handled_position`: the log position up to which the node's agent has handled the events it
    consumes (None: an agent that does not say). What `running_job_ids` omits is gone only once the
    agent has handled the release: before, a reservation still in its backlog may yet start.
    `running_job_ids` also lists a job that ended on the node while a report of it (its
    WorkerExited) is not yet published."""
    flow: ClassVar[Flow] = Flow(writers=(NODE_AGENT,), stream="heartbeat")


    node: NodeName
    sequence: Annotated[int, msgspec.Meta(ge=0)] = 0
    running_job_ids: list[JobId] = msgspec.field(default_factory=list)
    handled_position: Annotated[int, msgspec.Meta(ge=0)] | None = None


class NodeLost(Event, frozen=True, kw_only=True):
    flow: ClassVar[Flow] = Flow(
        writers=(PLACEMENT,), stream="node", consumers=(ADMISSION, QUOTA, PREEMPTION, NODE_AGENT))
    node: NodeName
    last_heartbeat_at: UtcDatetime | None = None
    reason: Reason


class NodeCondition(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A condition that holds on a node, as the kubelet's: its type and what was measured."""

    type: Literal["DiskPressure", "MemoryPressure"]
    message: str


class NodeConditionsChanged(Event, frozen=True, kw_only=True):
    """The conditions a node's agent measures on its node now (an empty list: none), sent when they
    change and after each registration. A node under a condition takes no new work
    (`corral.core.conditions`); what runs there goes on. It clears by itself: the agent reports the
    empty list once its measures are back above its thresholds. Recorded by placement on the
    node's stream."""
    flow: ClassVar[Flow] = Flow(writers=(PLACEMENT,), stream="node", inbox=("node",), consumers=(QUOTA, PREEMPTION))


    node: NodeName
    conditions: list[NodeCondition] = msgspec.field(default_factory=list)


class GpuProblem(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Why one GPU is unhealthy, as its node's agent saw it through NVML (what the Kubernetes device
    plugin and DCGM watch): a critical XID event (`xid`), volatile double-bit ECC errors, or a GPU
    that fell off the bus (NVML_ERROR_GPU_IS_LOST)."""

    gpu: GpuIndex
    code: Literal["XID", "ECC_DOUBLE_BIT", "GPU_LOST"]
    message: str
    xid: Annotated[int, msgspec.Meta(ge=0)] | None = None


class GpuHealthChanged(Event, frozen=True, kw_only=True):
    """The GPUs of a node that its agent finds unhealthy now (an empty list: every GPU is healthy),
    sent when that changes and after each registration. An unhealthy GPU takes no new work, and a
    gang holding it is released and requeued from its checkpoint (`GPU_UNHEALTHY`), as for a lost
    node. Recorded by placement on the node's stream."""
    flow: ClassVar[Flow] = Flow(writers=(PLACEMENT,), stream="node", inbox=("node",), consumers=(QUOTA, PREEMPTION))

    node: NodeName
    unhealthy: list[GpuProblem] = msgspec.field(default_factory=list)


class GpuDrained(Event, frozen=True, kw_only=True):
    """No new work on GPU `gpu` of `node` (`corral gpu drain NODE:INDEX`); a gang running on it goes
    on to its end. Sent to the inbox by an admin, recorded by placement on the node's stream."""
    flow: ClassVar[Flow] = Flow(writers=(PLACEMENT,), stream="node", inbox=("admin",), consumers=(QUOTA, PREEMPTION))

    node: NodeName
    gpu: GpuIndex
    user: str
    message: str = ""


class GpuUndrained(Event, frozen=True, kw_only=True):
    """GPU `gpu` of `node` takes new work again (`corral gpu undrain NODE:INDEX`)."""
    flow: ClassVar[Flow] = Flow(writers=(PLACEMENT,), stream="node", inbox=("admin",), consumers=(QUOTA, PREEMPTION))

    node: NodeName
    gpu: GpuIndex
    user: str
    message: str = ""


class NodeDrained(Event, frozen=True, kw_only=True):
    """No new work on `node` (Slurm's DRAIN): running jobs go on to their end, or with `evict` are
    asked to checkpoint and wait again elsewhere (preemption asks them). Sent to the inbox by an
    admin (`corral drain`), recorded by placement on the node's stream."""
    flow: ClassVar[Flow] = Flow(writers=(PLACEMENT,), stream="node", inbox=("admin",), consumers=(QUOTA, PREEMPTION))


    node: NodeName
    user: str
    message: str = ""
    evict: bool = False


class NodeUndrained(Event, frozen=True, kw_only=True):
    """`node` takes new work again (`corral undrain`)."""
    flow: ClassVar[Flow] = Flow(writers=(PLACEMENT,), stream="node", inbox=("admin",), consumers=(QUOTA, PREEMPTION))


    node: NodeName
    user: str
    message: str = ""


# --- queues --------------------------------------------------------------------------------


class QueueConfigured(Event, frozen=True, kw_only=True):
    """One queue of the tree set (or changed) by `corral apply`; stream `queue-<name>`."""
    flow: ClassVar[Flow] = Flow(
        writers=(QUOTA,), stream="queue", inbox=("admin",), consumers=(ADMISSION, PREEMPTION, PLACEMENT, NODE_AGENT))


    queue: QueueSpec


class GateCheck(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One criterion of the evidence gate (`corral apply --require "queue Q METRIC OP VALUE"`)
    and what the what-if replay measured for it under the current and the proposed tree."""

    criterion: str
    queue: QueuePath
    metric: str
    op: str
    threshold: float
    before: float | None = None
    after: float | None = None
    passed: bool


class QueueTreeApplied(Event, frozen=True, kw_only=True, tag="QueueTreeApplied"):
    """One version of the whole queue tree, stream `queue-tree`: the stream's version N is config
    version N. Sent to the inbox by `corral apply` (or `--rollback`); quota records it together with
    a QueueConfigured for every queue it changes, in one transaction.

    `user` is who applied it, `message` why (`--message`), `rollback_of` the version it restores.
    The evidence gate is quota's: `gates` are the standing gates the change declares (None: those in
    force stay; recorded: the gates in force from this version on), `require` the criteria this
    change alone must also pass, `what_if_since` where the replayed workload starts (None: the whole
    log). Quota replays the recorded workload under the current and the proposed tree and records
    `evidence`, the checks of every gate in force, of the declared ones and of `require` (what a
    request carries there is ignored); a miss records a QueueChangeRefused instead.

    v2: `gates`, `require` and `what_if_since` (a v1 declared no gate; `UPCASTERS`)."""

    schema_version: int = 2
    flow: ClassVar[Flow] = Flow(writers=(QUOTA,), stream="queues", inbox=("admin",), consumers=(PREEMPTION, PLACEMENT))


    queues: list[QueueSpec]
    user: str
    message: str = ""
    rollback_of: Annotated[int, msgspec.Meta(ge=1)] | None = None
    evidence: list[GateCheck] = msgspec.field(default_factory=list)
    gates: list[str] | None = None
    require: list[str] = msgspec.field(default_factory=list)
    what_if_since: UtcDatetime | None = None


class QueueChangeRefused(Event, frozen=True, kw_only=True):
    """A proposed queue tree quota refused (stream `queue-gate`): its what-if replay missed at least
    one gate (standing, declared or `--require`), or the tree would be inconsistent, so nothing was
    applied. Recorded by quota alone, so that the log shows the checks that stopped a change, not
    only the changes that passed."""
    flow: ClassVar[Flow] = Flow(writers=(QUOTA,), stream="queues-gate")


    queues: list[QueueSpec]
    user: str
    message: str = ""
    evidence: list[GateCheck]


# --- policy --------------------------------------------------------------------------------

PolicyName = Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9-]{0,31}$",
                                         description="a scheduling policy: corral, fair-las, las, ...")]


class PolicyInForce(Event, frozen=True, kw_only=True):
    """The scheduling policy quota, placement and preemption decide by (`corral up --policy`,
    CORRAL_POLICY), on stream `policy`. Quota records it when it starts under a policy other than
    the last one recorded (none recorded: `corral`), so that the log says which rules made each
    decision and `corral why` explains a wait by the rules that decide it."""
    flow: ClassVar[Flow] = Flow(writers=(QUOTA,), stream="policy")


    policy: PolicyName


# --- operations ----------------------------------------------------------------------------


class EventNotRelayed(Event, frozen=True, kw_only=True):
    """An alert on stream `cluster`: the outbox relay could not publish the event at `position`
    (e.g. larger than the bus takes) and moved on. The event stays in the log; consumers that
    need it read it from there. `reason.code`: EVENT_TOO_LARGE."""
    flow: ClassVar[Flow] = Flow(writers=(RELAY,), stream="cluster")


    position: Annotated[int, msgspec.Meta(ge=1)]
    event_id_skipped: str
    event_type: str
    event_stream: str
    size: Annotated[int, msgspec.Meta(ge=0)]
    limit: Annotated[int, msgspec.Meta(ge=0)]
    reason: Reason


# --- access ---------------------------------------------------------------------------------


class AccessDenied(Event, frozen=True, kw_only=True):
    """A request refused because its sender may not make it (e.g. cancelling another user's job);
    `reason.code` says which rule, `user` is the sender named by the request's subject."""
    flow: ClassVar[Flow] = Flow(writers=(ADMISSION,), stream="job")


    user: str
    request: str  # the refused request's event type
    job_id: JobId | None = None
    reason: Reason


# --- people ---------------------------------------------------------------------------------

UserName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$",
                                       description="a person's or pipeline's name: their NATS identity")]


class UserAdded(Event, frozen=True, kw_only=True):
    """A person, pipeline or admin given an identity of their own (`corral user add`), on stream
    `people`; `actor` is the admin who added them."""
    flow: ClassVar[Flow] = Flow(writers=(ADMIN_CLI,), stream="people")


    user: UserName
    kind: Literal["person", "pipeline", "admin"]


class UserRemoved(Event, frozen=True, kw_only=True):
    """A user's access taken away (`corral user remove`): their credentials are refused from now
    on; their jobs stay. On stream `people`; `actor` is the admin."""
    flow: ClassVar[Flow] = Flow(writers=(ADMIN_CLI,), stream="people")


    user: UserName


class UserCredentialsRotated(Event, frozen=True, kw_only=True):
    """A user's secrets replaced (`corral user rotate`): the old ones are refused from now on. On
    stream `people`; `actor` is the admin."""
    flow: ClassVar[Flow] = Flow(writers=(ADMIN_CLI,), stream="people")


    user: UserName


ALL_EVENTS: tuple[type[Event], ...] = (
    JobSubmitted, JobCancelRequested, JobAdmitted, JobRejected, QuotaReserved, QuotaReleased,
    GangReserved, GpusAllocated, GpusReleased, PlacementPending, WaitExceeded, PreemptRequested, CheckpointDone,
    GangReleased, JobRequeued, WorkerStarted, WorkerExited, JobRunning, JobCompleted, JobFailed, JobCancelled,
    NodeRegistered, NodeHeartbeat, NodeLost, NodeConditionsChanged, NodeDrained, NodeUndrained, JobHeld,
    JobHoldReleased,
    JobRequeueRequested, QueueConfigured, QueueTreeApplied, QueueChangeRefused, EventNotRelayed, AccessDenied,
    UserAdded, UserRemoved, UserCredentialsRotated, GpuHealthChanged, GpuDrained, GpuUndrained, PolicyInForce,
)


def _same_document_v2(doc: dict[str, Any]) -> dict[str, Any]:
    """v1 -> v2 of JobSubmitted, NodeRegistered, QueueTreeApplied (v2 only added fields whose
    defaults mean v1) and
    PreemptRequested (v2 only lets `for_job_id` be None; a v1 always names a job)."""
    return {**doc, "schema_version": 2}


#: (event type, from version) -> upcaster; `registry.REGISTRY` registers them.
UPCASTERS: tuple[tuple[str, int, Callable[[dict[str, Any]], dict[str, Any]]], ...] = (
    ("JobSubmitted", 1, _same_document_v2),
    ("NodeRegistered", 1, _same_document_v2),
    ("PreemptRequested", 1, _same_document_v2),
    ("QueueTreeApplied", 1, _same_document_v2),
)
