"""Corral's contracts: versioned msgspec events, the job/cluster/queue spec formats, subjects.

Pure data and validation, no I/O beyond reading a file the caller names. Import the pieces from
here or from their modules (`corral.contracts.events`, `.registry`, `.jobspec`, ...).

Why lazily: importing a submodule (`corral.contracts.worker`, which the job-side helper
`corral.worker` imports and which must cost a workload nothing) runs this package first. Importing
every contract here would load msgspec, yaml and every event class into each job; instead each name
below is imported on first use (PEP 562 `__getattr__`), and type checkers read the imports under
TYPE_CHECKING.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# submodule -> the names this package re-exports from it (the event classes: `events.__all__`)
_HOMES: dict[str, tuple[str, ...]] = {
    "cluster": (
        "ClusterSpec",
        "GpuDevice",
        "NodeInventory",
        "NodeSpec",
        "load_cluster_file",
        "load_cluster_text",
        "parse_cluster_shorthand",
        "validate_cluster_spec",
    ),
    "envelope": ("CLUSTER_STREAM", "Event", "Reason", "job_stream", "new_event_id", "node_stream", "queue_stream"),
    "jobspec": (
        "PRIORITY_CLASSES",
        "Checkpoint",
        "GpuRequest",
        "JobSpec",
        "RestartPolicy",
        "Topology",
        "load_job_spec",
        "validate_job_spec",
    ),
    "problems": ("ContractError", "Problem", "SpecError"),
    "queues": ("QueuesFile", "QueueSpec", "load_queues_file", "load_queues_text", "validate_queues"),
    "registry": ("REGISTRY", "EventRegistry", "decode", "encode"),
    "subjects": ("Subjects", "inbox_subject_for", "subject_for"),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    """Import a re-exported name on first use, then keep it as an ordinary module attribute."""
    if name == "__all__":
        value: Any = [*_HOME, *_event_names()]
    elif name in _HOME:
        value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    elif name[:1].isupper() and name in _event_names():
        value = getattr(importlib.import_module(f"{__name__}.events"), name)
    else:  # a submodule not imported yet, or a typo: the import system takes it from here
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def _event_names() -> list[str]:
    return list(importlib.import_module(f"{__name__}.events").__all__)
