"""Whether a job's shape can ever fit the cluster, remembered per shape while the cluster stays.

Why: judging a submission against the whole cluster counts its GPUs node by node
(`capacity_shortfall`: ~36 us at 75 nodes x 8 GPUs) and searches the idle cluster
(`core.static_feasibility`: ~67 us), while submissions share a few shapes and the cluster changes
only when a node registers or goes. Both answers depend on the job's shape and the cluster alone
(`corral.core.shortcuts.shaped`, the one definition of a job's shape), and `ClusterView.cluster()`
returns the same Cluster object while no node changes, so the answers are kept per shape until the
cluster object is another.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from corral import core
from corral.core.shortcuts import shaped

V = TypeVar("V")

__all__ = ["ShapeVerdicts"]


class ShapeVerdicts(Generic[V]):
    """`judge(job, cluster)` per job shape, kept while `cluster` is the same object."""

    def __init__(self, judge: Callable[[core.Job, core.Cluster], V], limit: int = 1024) -> None:
        self._judge = judge
        self._limit = limit
        self._cluster: core.Cluster | None = None
        self._verdicts: dict[core.Job, V] = {}

    def __call__(self, job: core.Job, cluster: core.Cluster) -> V:
        if cluster is not self._cluster or len(self._verdicts) >= self._limit:
            self._cluster, self._verdicts = cluster, {}
        shape = shaped(job)
        try:
            return self._verdicts[shape]
        except KeyError:
            verdict = self._verdicts[shape] = self._judge(shape, cluster)
            return verdict
