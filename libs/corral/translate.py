"""Contracts to the core's model: the one place wire types become scheduling types.

Why a separate module: the core is pure standard library (it must not know msgspec), and the
contracts must not know the core. The live services, the CLI and the simulator translate here, so a
spec means the same thing to admission, to placement, to `corral why` and to a replay.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from corral import core
from corral.contracts.cluster import ClusterSpec, NodeInventory
from corral.contracts.envelope import Reason as WireReason
from corral.contracts.jobspec import JobSpec
from corral.contracts.queues import QueueSpec


def job_from_spec(job_id: str, spec: JobSpec, submit_time: float, user: str | None = None) -> core.Job:
    """The core's Job for a validated spec (priority classes are already integers); `user`: who
    submitted it, as the log records it (None: not limited per user)."""
    topo = spec.topology
    return core_job(
        job_id=job_id,
        queue=spec.queue,
        replicas=spec.replicas,
        gpus_per_replica=spec.gpus_per_replica,
        submit_time=submit_time,
        priority=int(spec.priority),
        gpu_model=spec.gpu.model if spec.gpu is not None else None,
        gpu_min_memory_gib=spec.gpu.min_memory_gib if spec.gpu is not None else None,
        topology=(topo.replica, topo.gang, topo.prefer),
        preemptible=spec.preemptible,
        checkpoint_grace_seconds=spec.checkpoint.grace_seconds,
        min_runtime_seconds=spec.min_runtime_seconds,
        estimated_runtime_seconds=spec.estimated_runtime_seconds,
        cpus_per_replica=spec.cpus_per_replica,
        memory_gib_per_replica=spec.memory_gib_per_replica,
        datasets=frozenset(m.dataset for m in spec.mounts if m.dataset is not None),
        user=user,
    )


def core_job(
    *,
    job_id: str,
    queue: str,
    replicas: int,
    gpus_per_replica: int,
    submit_time: float,
    priority: int,
    gpu_model: str | None,
    gpu_min_memory_gib: float | None,
    topology: tuple[str | None, str | None, str | None],
    preemptible: bool,
    checkpoint_grace_seconds: float,
    min_runtime_seconds: float,
    estimated_runtime_seconds: float | None,
    cpus_per_replica: float | None = None,
    memory_gib_per_replica: float | None = None,
    datasets: frozenset[str] = frozenset(),
    user: str | None = None,
) -> core.Job:
    """The one translation of a job request's fields into the core's Job.

    The problem it solves: the services (`job_from_spec`) and the simulator (its `SimJob`s come
    from traces as well as from specs) each built a `core.Job`, and they disagreed on rounding
    (the services truncated the checkpoint grace, the simulator rounded it up), so a replay did not
    decide what the cluster would. Both call this now. `topology` is (replica, gang, prefer); a
    GPU request that names neither a model nor a memory size is no request (any GPU). Host CPUs
    and memory per replica become a need per GPU (`core.GpuRequest.fits_node`), and the datasets
    the job mounts restrict it to nodes that hold them.
    """
    gpu: core.GpuRequest | None = core.GpuRequest(
        model=gpu_model, min_memory_gib=None if gpu_min_memory_gib is None else math.ceil(gpu_min_memory_gib),
        cpus_per_gpu=None if cpus_per_replica is None else cpus_per_replica / gpus_per_replica,
        memory_gib_per_gpu=None if memory_gib_per_replica is None else memory_gib_per_replica / gpus_per_replica,
        datasets=datasets)
    if gpu is not None and gpu.is_any:
        gpu = None
    replica, gang, prefer = topology
    return core.Job(
        id=job_id,
        queue=queue,
        replicas=replicas,
        gpus_per_replica=gpus_per_replica,
        submit_time=submit_time,
        priority=priority,
        gpu=gpu,
        topology=core.Topology(
            replica=core.TopologyLevel(replica) if replica else None,
            gang=core.TopologyLevel(gang) if gang else None,
            prefer=core.TopologyLevel(prefer) if prefer else None,
        ),
        preemptible=preemptible,
        checkpoint_grace_seconds=whole_seconds_at_least(checkpoint_grace_seconds),
        min_runtime_seconds=whole_seconds_at_least(min_runtime_seconds),
        estimated_runtime_seconds=estimated_runtime_seconds,
        user=user,
    )


def whole_seconds_at_least(seconds: float) -> int:
    """A promised duration in the core's whole seconds: rounded up, never less than asked.

    The core counts whole seconds, specs allow fractions, and the services and the simulator must
    round alike. Both durations it is used
    for are promises to the job: `checkpoint_grace_seconds` is a deadline (the time a preempted
    job has to write its checkpoint before its GPUs are taken back, and when the core expects
    them free), and `min_runtime_seconds` is how long a started job is safe from preemption.
    Rounding down would give the job less than it asked for (a 30.5 s grace would be 30 s, and the
    core would plan on GPUs half a second before they come free); rounding up gives it at most
    one second more. So: ceiling.
    """
    return math.ceil(seconds)


def node_from_inventory(inv: NodeInventory, state: core.NodeState = core.NodeState.READY,
                        out_of_service: frozenset[int] = frozenset()) -> core.Node:
    domain_of = {gpu: d for d, members in enumerate(inv.nvlink_domains) for gpu in members}
    gpus = tuple(
        core.Gpu(index=g.index, model=g.model or "unknown", memory_gib=int(g.memory_gib or 0),
                 nvlink_domain=domain_of.get(g.index, len(inv.nvlink_domains) + g.index))
        for g in sorted(inv.gpus, key=lambda g: g.index)
    )
    return core.Node(name=inv.node, gpus=gpus, rack=inv.rack, zone=inv.zone, state=state, cpus=inv.cpus,
                     memory_gib=inv.host_memory_gib, datasets=frozenset(inv.datasets),
                     out_of_service=out_of_service)


def cluster_from_spec(spec: ClusterSpec) -> core.Cluster:
    """A cluster file (as `corral up` and `corral sim` read it) as the core's Cluster."""
    return core.Cluster(tuple(
        node_from_inventory(n.inventory(), core.NodeState.DRAINING if n.state == "draining" else core.NodeState.READY)
        for n in spec.nodes))


def queue_from_spec(spec: QueueSpec) -> core.QueueConfig:
    return core.QueueConfig(name=spec.name, guaranteed_gpus=spec.guaranteed_gpus, max_gpus=spec.max_gpus,
                            lend_limit=spec.lend_limit, weight=spec.weight, max_gpus_per_user=spec.max_gpus_per_user)


def queues_from_specs(specs: Iterable[QueueSpec]) -> tuple[core.QueueConfig, ...]:
    return tuple(queue_from_spec(q) for q in sorted(specs, key=lambda q: (q.name.count("/"), q.name)))


def wire_reason(reason: core.Reason) -> WireReason:
    """A core Reason as the contracts carry it (details become a JSON object)."""
    return WireReason(code=str(reason.code), message=reason.message, details=dict(reason.details))


def placement_ranks(placement: core.Placement) -> list[dict[str, object]]:
    return [{"rank": r.rank, "node": r.node, "gpus": list(r.gpus)} for r in placement.ranks]
