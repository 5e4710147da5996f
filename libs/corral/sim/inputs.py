"""The simulator's cluster and queues: from the same files `corral up` reads, or shorthands.

Why here and not in the core: turning a person's file into core values is I/O and validation; the
core only ever sees the resulting `Cluster` and `QueueConfig` values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from corral.contracts.cluster import load_cluster_file, parse_cluster_shorthand
from corral.contracts.queues import load_queues_file
from corral.core import Cluster, QueueConfig
from corral.translate import cluster_from_spec, queue_from_spec


def load_cluster(source: str | Path | Cluster) -> Cluster:
    """A cluster from a file path (YAML/JSON, as `corral up`) or a shorthand like `64x8:H100`
    (64 nodes of 8 GPUs, each node one NVLink domain, racks of 8 nodes)."""
    if isinstance(source, Cluster):
        return source
    path = Path(source)
    spec = load_cluster_file(path) if path.is_file() else parse_cluster_shorthand(str(source))
    return cluster_from_spec(spec)


def load_queues(path: str | Path) -> tuple[QueueConfig, ...]:
    """Queues from a queues file (as `corral apply`), parents first, implied parents added."""
    return tuple(
        queue_from_spec(q) for q in load_queues_file(path).resolved()
    )


def equal_share_queues(names: Sequence[str], capacity: int) -> tuple[QueueConfig, ...]:
    """Without a queues file every queue named by the workload gets an equal share: guaranteed =
    floor(capacity / number of queues), weight 1, no ceiling."""
    if not names:
        return ()
    each = math.floor(capacity / len(names))
    return tuple(QueueConfig(name, guaranteed_gpus=each) for name in names)


def complete_queues(configured: Sequence[QueueConfig], names: Sequence[str]) -> tuple[QueueConfig, ...]:
    """A queues file plus a zero-guarantee queue for any workload queue it does not name, so that
    a stray queue name does not make every one of its jobs fail with QUEUE_UNKNOWN."""
    known = {q.name for q in configured}
    return tuple(configured) + tuple(QueueConfig(n) for n in names if n not in known)
