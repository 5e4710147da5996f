"""Corral's contracts: versioned msgspec events, the job/cluster/queue spec formats, subjects.

Pure data and validation, no I/O beyond reading a file the caller names. Import the pieces from
here or from their modules (`corral.contracts.events`, `.registry`, `.jobspec`, ...).
"""

from corral.contracts.cluster import (
    ClusterSpec,
    GpuDevice,
    NodeInventory,
    NodeSpec,
    load_cluster_file,
    load_cluster_text,
    parse_cluster_shorthand,
    validate_cluster_spec,
)
from corral.contracts.envelope import (
    CLUSTER_STREAM,
    Event,
    Reason,
    job_stream,
    new_event_id,
    node_stream,
    queue_stream,
)
from corral.contracts.events import *  # noqa: F403  (the event classes, listed in events.__all__)
from corral.contracts.events import __all__ as _events_all
from corral.contracts.jobspec import (
    PRIORITY_CLASSES,
    Checkpoint,
    GpuRequest,
    JobSpec,
    RestartPolicy,
    Topology,
    load_job_spec,
    validate_job_spec,
)
from corral.contracts.problems import ContractError, Problem, SpecError
from corral.contracts.queues import QueuesFile, QueueSpec, load_queues_file, load_queues_text, validate_queues
from corral.contracts.registry import REGISTRY, EventRegistry, decode, encode
from corral.contracts.subjects import Subjects, inbox_subject_for, subject_for

__all__ = [
    "CLUSTER_STREAM",
    "PRIORITY_CLASSES",
    "REGISTRY",
    "Checkpoint",
    "ClusterSpec",
    "ContractError",
    "Event",
    "EventRegistry",
    "GpuDevice",
    "GpuRequest",
    "JobSpec",
    "NodeInventory",
    "NodeSpec",
    "Problem",
    "QueueSpec",
    "QueuesFile",
    "Reason",
    "RestartPolicy",
    "SpecError",
    "Subjects",
    "Topology",
    "decode",
    "encode",
    "inbox_subject_for",
    "job_stream",
    "load_cluster_file",
    "load_cluster_text",
    "load_job_spec",
    "load_queues_file",
    "load_queues_text",
    "new_event_id",
    "node_stream",
    "parse_cluster_shorthand",
    "queue_stream",
    "subject_for",
    "validate_cluster_spec",
    "validate_job_spec",
    "validate_queues",
    *_events_all,
]
