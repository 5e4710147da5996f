"""Contracts to the core's model: the one place wire types become scheduling types.

Why a separate module: the core is pure standard library (it must not know msgspec), and the
contracts must not know the core. The live services and the CLI translate here, so a spec means
the same thing to admission, to placement and to `corral why`.
"""

from __future__ import annotations

from collections.abc import Iterable

from corral import core
from corral.contracts.cluster import ClusterSpec, NodeInventory
from corral.contracts.envelope import Reason as WireReason
from corral.contracts.jobspec import JobSpec
from corral.contracts.queues import QueueSpec


def job_from_spec(job_id: str, spec: JobSpec, submit_time: float) -> core.Job:
    """The core's Job for a validated spec (priority classes are already integers)."""
    topo = spec.topology
    return core.Job(
        id=job_id,
        queue=spec.queue,
        replicas=spec.replicas,
        gpus_per_replica=spec.gpus_per_replica,
        submit_time=submit_time,
        priority=int(spec.priority),
        gpu=(core.GpuRequest(model=spec.gpu.model,
                             min_memory_gib=None if spec.gpu.min_memory_gib is None
                             else int(spec.gpu.min_memory_gib + 0.999))
             if spec.gpu is not None else None),
        topology=core.Topology(
            replica=core.TopologyLevel(topo.replica) if topo.replica else None,
            gang=core.TopologyLevel(topo.gang) if topo.gang else None,
            prefer=core.TopologyLevel(topo.prefer) if topo.prefer else None,
        ),
        preemptible=spec.preemptible,
        checkpoint_grace_seconds=int(spec.checkpoint.grace_seconds),
        min_runtime_seconds=int(spec.min_runtime_seconds),
        estimated_runtime_seconds=spec.estimated_runtime_seconds,
    )


def node_from_inventory(inv: NodeInventory, state: core.NodeState = core.NodeState.READY) -> core.Node:
    domain_of = {gpu: d for d, members in enumerate(inv.nvlink_domains) for gpu in members}
    gpus = tuple(
        core.Gpu(index=g.index, model=g.model or "unknown", memory_gib=int(g.memory_gib or 0),
                 nvlink_domain=domain_of.get(g.index, len(inv.nvlink_domains) + g.index))
        for g in sorted(inv.gpus, key=lambda g: g.index)
    )
    return core.Node(name=inv.node, gpus=gpus, rack=inv.rack, zone=inv.zone, state=state)


def cluster_from_spec(spec: ClusterSpec) -> core.Cluster:
    """A cluster file (as `corral up` and `corral sim` read it) as the core's Cluster."""
    return core.Cluster(tuple(
        node_from_inventory(n.inventory(), core.NodeState.DRAINING if n.state == "draining" else core.NodeState.READY)
        for n in spec.nodes))


def queue_from_spec(spec: QueueSpec) -> core.QueueConfig:
    return core.QueueConfig(name=spec.name, guaranteed_gpus=spec.guaranteed_gpus, max_gpus=spec.max_gpus,
                            lend_limit=spec.lend_limit, weight=spec.weight)


def queues_from_specs(specs: Iterable[QueueSpec]) -> tuple[core.QueueConfig, ...]:
    return tuple(queue_from_spec(q) for q in sorted(specs, key=lambda q: (q.name.count("/"), q.name)))


def wire_reason(reason: core.Reason) -> WireReason:
    """A core Reason as the contracts carry it (details become a JSON object)."""
    return WireReason(code=str(reason.code), message=reason.message, details=dict(reason.details))


def placement_ranks(placement: core.Placement) -> list[dict[str, object]]:
    return [{"rank": r.rank, "node": r.node, "gpus": list(r.gpus)} for r in placement.ranks]
