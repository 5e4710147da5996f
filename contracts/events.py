"""Every event of Corral, version 1. Envelope fields come from `Event`; payloads are listed here.

Flow (see docs/architecture.md): JobSubmitted -> JobAdmitted | JobRejected -> QuotaReserved ->
GangReserved | PlacementPending -> WorkerStarted x N -> JobRunning -> WorkerExited ->
JobCompleted | JobFailed. Preemption: PreemptRequested -> CheckpointDone -> GangReleased ->
JobRequeued. Nodes: NodeRegistered, NodeHeartbeat, NodeLost; GpusAllocated / GpusReleased are
each node's allocation ledger. Queues: QueueConfigured. Which types arrive through the inbox is
listed in `subjects.INBOX_TYPES`.

Expected outcomes that are not successes carry a `Reason` (code, message with numbers, details).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from corral.contracts.cluster import GpuDevice, GpuIndex, Location, NodeName
from corral.contracts.envelope import Event, Reason, UtcDatetime
from corral.contracts.jobspec import JobSpec, QueuePath, Signal
from corral.contracts.problems import Problem
from corral.contracts.queues import QueueSpec

__all__ = [
    "ALL_EVENTS",
    "CheckpointDone",
    "EventNotRelayed",
    "GangReleased",
    "GangReserved",
    "GpusAllocated",
    "GpusReleased",
    "JobAdmitted",
    "JobCancelRequested",
    "JobCancelled",
    "JobCompleted",
    "JobFailed",
    "JobRejected",
    "JobRequeued",
    "JobRunning",
    "JobSubmitted",
    "NodeHeartbeat",
    "NodeLost",
    "NodeRegistered",
    "PlacementPending",
    "PortRange",
    "PreemptRequested",
    "QueueConfigured",
    "QuotaReleased",
    "QuotaReserved",
    "RankPlacement",
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


class JobSubmitted(Event, frozen=True, kw_only=True):
    """A user or pipeline asks for a job; published to the inbox, appended by admission."""

    job_id: JobId
    spec: JobSpec
    submission_id: str | None = None
    user: str | None = None


class JobCancelRequested(Event, frozen=True, kw_only=True):
    """A user asks to cancel a job; published to the inbox."""

    job_id: JobId
    user: str | None = None
    message: str = ""


class JobAdmitted(Event, frozen=True, kw_only=True):
    """Admission accepted the spec; the denormalised numbers spare consumers a lookup."""

    job_id: JobId
    queue: QueuePath
    priority: int
    replicas: Annotated[int, msgspec.Meta(ge=1)]
    gpus_per_replica: Annotated[int, msgspec.Meta(ge=1)]


class JobRejected(Event, frozen=True, kw_only=True):
    """Admission refused the job; `problems` name the fields (empty for non-field reasons)."""

    job_id: JobId
    reason: Reason
    problems: list[Problem] = msgspec.field(default_factory=list)


class QuotaReserved(Event, frozen=True, kw_only=True):
    """Quota set aside for a job; `borrowed` is how many of `gpus` come from siblings' guarantees."""

    job_id: JobId
    queue: QueuePath
    gpus: Gpus
    borrowed: Gpus = 0


class QuotaReleased(Event, frozen=True, kw_only=True):
    job_id: JobId
    queue: QueuePath
    gpus: Gpus
    reason: Reason


class GangReserved(Event, frozen=True, kw_only=True):
    """Placement's decision: every rank's node and GPUs, all at once (all-or-nothing).

    `master_addr` is the address rank 0's node registered; `master_port` a port of that node's
    rendezvous range no other live gang holds on that address (see `corral.core.rendezvous`)."""

    job_id: JobId
    ranks: Annotated[list[RankPlacement], msgspec.Meta(min_length=1)]
    world_size: Annotated[int, msgspec.Meta(ge=1)]
    master_addr: str
    master_port: Port
    attempt: Attempt = 0
    resume_from: str | None = None


class PlacementPending(Event, frozen=True, kw_only=True):
    """The job waits; emitted only when the reason changes (codes: GANG_DOES_NOT_FIT, ...)."""

    job_id: JobId
    reason: Reason


class PreemptRequested(Event, frozen=True, kw_only=True):
    """The victim must checkpoint (send `signal`) and stop by `deadline` to make room for `for_job_id`."""

    victim_job_id: JobId
    for_job_id: JobId
    deadline: UtcDatetime
    signal: Signal = "SIGUSR1"
    reason: Reason


class CheckpointDone(Event, frozen=True, kw_only=True):
    """A worker reported a checkpoint at `path` (what `CORRAL_RESUME_FROM` will point to)."""

    job_id: JobId
    path: str
    step: int | None = None
    rank: Rank | None = None
    attempt: Attempt = 0


class GangReleased(Event, frozen=True, kw_only=True):
    """The job's GPUs are free again (preempted, finished, failed, node lost, start timeout)."""

    job_id: JobId
    reason: Reason
    attempt: Attempt = 0


class JobRequeued(Event, frozen=True, kw_only=True):
    """The job waits again; its next attempt resumes from `resume_from` (None: start over)."""

    job_id: JobId
    resume_from: str | None = None
    reason: Reason
    attempt: Attempt  # the number of the attempt that will run next


class WorkerStarted(Event, frozen=True, kw_only=True):
    job_id: JobId
    rank: Rank
    node: NodeName
    pid: Annotated[int, msgspec.Meta(ge=0)]
    attempt: Attempt = 0


class WorkerExited(Event, frozen=True, kw_only=True):
    """`exit_code` None: killed by a signal (named in `reason.details["signal"]`)."""

    job_id: JobId
    rank: Rank
    node: NodeName
    exit_code: int | None
    attempt: Attempt = 0
    reason: Reason


class JobRunning(Event, frozen=True, kw_only=True):
    """Every rank of the attempt started (the gang start barrier passed)."""

    job_id: JobId
    attempt: Attempt = 0


class JobCompleted(Event, frozen=True, kw_only=True):
    job_id: JobId
    attempt: Attempt = 0


class JobFailed(Event, frozen=True, kw_only=True):
    job_id: JobId
    reason: Reason
    attempt: Attempt = 0


class JobCancelled(Event, frozen=True, kw_only=True):
    job_id: JobId
    reason: Reason


# --- nodes ---------------------------------------------------------------------------------


class GpusAllocated(Event, frozen=True, kw_only=True):
    """The node's share of a GangReserved, on stream `node-<name>`: the node's allocation ledger.

    Appended in the same transaction as the GangReserved, with the node stream's expected
    version, so a decision taken on a stale view of the node is refused; a database trigger
    mirrors it into the `allocations` table whose unique index refuses a GPU held twice.
    """

    node: NodeName
    job_id: JobId
    gpus: Annotated[list[GpuIndex], msgspec.Meta(min_length=1)]
    attempt: Attempt = 0


class GpusReleased(Event, frozen=True, kw_only=True):
    """The node's share of a GangReleased, on stream `node-<name>`."""

    node: NodeName
    job_id: JobId
    gpus: list[GpuIndex]
    attempt: Attempt = 0


class NodeRegistered(Event, frozen=True, kw_only=True):
    """A node agent's inventory: every GPU, NVLink domains covering all GPUs, rack and zone."""

    node: NodeName
    gpus: list[GpuDevice]
    nvlink_domains: list[list[GpuIndex]]
    rack: Location
    zone: Location
    #: Where other hosts reach this node: rank 0's node address is a gang's `MASTER_ADDR`. None
    #: (agents before issue 15, simulated nodes): placement uses `CORRAL_MASTER_ADDR` (127.0.0.1).
    address: Address | None = None
    #: The ports placement may give a gang whose rank 0 runs here as `MASTER_PORT`; None: the
    #: default range (`corral.core.rendezvous.DEFAULT_PORT_RANGE`).
    rendezvous_ports: PortRange | None = None


class NodeHeartbeat(Event, frozen=True, kw_only=True):
    """`handled_position`: the log position up to which the node's agent has handled the events it
    consumes (None: an agent that does not say). What `running_job_ids` omits is gone only once the
    agent has handled the release: before, a reservation still in its backlog may yet start."""

    node: NodeName
    sequence: Annotated[int, msgspec.Meta(ge=0)] = 0
    running_job_ids: list[JobId] = msgspec.field(default_factory=list)
    handled_position: Annotated[int, msgspec.Meta(ge=0)] | None = None


class NodeLost(Event, frozen=True, kw_only=True):
    node: NodeName
    last_heartbeat_at: UtcDatetime | None = None
    reason: Reason


# --- queues --------------------------------------------------------------------------------


class QueueConfigured(Event, frozen=True, kw_only=True):
    """One queue of the tree set (or changed) by `corral apply`; stream `queue-<name>`."""

    queue: QueueSpec


# --- operations ----------------------------------------------------------------------------


class EventNotRelayed(Event, frozen=True, kw_only=True):
    """An alert on stream `cluster`: the outbox relay could not publish the event at `position`
    (e.g. larger than the bus takes) and moved on. The event stays in the log; consumers that
    need it read it from there. `reason.code`: EVENT_TOO_LARGE."""

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

    user: str
    request: str  # the refused request's event type
    job_id: JobId | None = None
    reason: Reason


ALL_EVENTS: tuple[type[Event], ...] = (
    JobSubmitted, JobCancelRequested, JobAdmitted, JobRejected, QuotaReserved, QuotaReleased,
    GangReserved, GpusAllocated, GpusReleased, PlacementPending, PreemptRequested, CheckpointDone,
    GangReleased, JobRequeued, WorkerStarted, WorkerExited, JobRunning, JobCompleted, JobFailed, JobCancelled,
    NodeRegistered, NodeHeartbeat, NodeLost, QueueConfigured, EventNotRelayed, AccessDenied,
)

