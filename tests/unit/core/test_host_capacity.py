"""Host CPUs, memory and datasets in placement: a rank gets at most its GPUs' share of
its node's CPUs and memory, so a node is never oversubscribed; a job mounting a node-local dataset
goes only where the dataset is. Nodes that declare no capacity are not limited."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.contracts.cluster import load_cluster_text
from corral.core import Cluster, Gpu, GpuRequest, Node, Placement, ReasonCode
from corral.core.gpuset import FreeGpus
from corral.core.placement import find_placement, static_feasibility
from corral.translate import core_job, node_from_inventory
from tests.unit.core.builders import job


def node(name: str, cpus: float | None = None, memory: float | None = None, datasets: tuple[str, ...] = (),
         gpus: int = 8) -> Node:
    return Node(name, tuple(Gpu(i, "H100", 80) for i in range(gpus)), "r0", "z0", cpus=cpus, memory_gib=memory,
                datasets=frozenset(datasets))


def place(cluster: Cluster, **request: object) -> Placement | object:
    j = job("j", replicas=1, gpus=2, gpu=GpuRequest(**request))  # type: ignore[arg-type]
    return find_placement(cluster, FreeGpus(cluster), j)


def test_a_rank_goes_where_its_gpus_share_of_cpus_and_memory_is_enough() -> None:
    cluster = Cluster((node("small", cpus=32, memory=256), node("big", cpus=128, memory=2048)))
    found = place(cluster, cpus_per_gpu=8.0)  # small gives 4 CPUs per GPU, big 16
    assert isinstance(found, Placement) and found.nodes() == ("big",)
    found = place(cluster, memory_gib_per_gpu=64.0)  # small gives 32 GiB per GPU
    assert isinstance(found, Placement) and found.nodes() == ("big",)
    assert isinstance(place(cluster, cpus_per_gpu=4.0), Placement)


def test_a_node_without_declared_capacity_is_not_limited() -> None:
    found = place(Cluster((node("unknown"),)), cpus_per_gpu=1000.0, memory_gib_per_gpu=1000.0)
    assert isinstance(found, Placement)


def test_a_node_local_dataset_restricts_the_job_to_nodes_holding_it() -> None:
    cluster = Cluster((node("a", datasets=("imagenet",)), node("b", datasets=("imagenet", "c4"))))
    found = place(cluster, datasets=frozenset({"c4"}))
    assert isinstance(found, Placement) and found.nodes() == ("b",)


def test_admission_refuses_what_no_node_can_give_naming_the_need() -> None:
    cluster = Cluster((node("a", cpus=32),))
    reason = static_feasibility(cluster, job("j", gpus=1, gpu=GpuRequest(cpus_per_gpu=16.0)))
    assert reason is not None and reason.code is ReasonCode.NO_MATCHING_GPU
    assert ">= 16 host CPUs per GPU" in reason.message
    assert "its nodes give at most 4 host CPUs per GPU" in reason.message
    reason = static_feasibility(cluster, job("j", gpus=1, gpu=GpuRequest(datasets=frozenset({"c4"}))))
    assert reason is not None and "any GPU on a node with dataset c4" in reason.message
    assert "its nodes give datasets none" in reason.message


def test_the_spec_and_the_cluster_file_translate_into_these_needs() -> None:
    j = core_job(job_id="j", queue="q", replicas=2, gpus_per_replica=4, submit_time=0, priority=0, gpu_model=None,
                 gpu_min_memory_gib=None, topology=("node", None, None), preemptible=True,
                 checkpoint_grace_seconds=30, min_runtime_seconds=0, estimated_runtime_seconds=None,
                 cpus_per_replica=32, memory_gib_per_replica=256, datasets=frozenset({"c4"}))
    assert j.gpu == GpuRequest(cpus_per_gpu=8.0, memory_gib_per_gpu=64.0, datasets=frozenset({"c4"}))
    plain = core_job(job_id="j", queue="q", replicas=1, gpus_per_replica=1, submit_time=0, priority=0, gpu_model=None,
                     gpu_min_memory_gib=None, topology=("node", None, None), preemptible=True,
                     checkpoint_grace_seconds=30, min_runtime_seconds=0, estimated_runtime_seconds=None)
    assert plain.gpu is None
    inv = load_cluster_text("""
datasets: {imagenet: /shared/imagenet}
nodes: [{name: a, gpus: 8, model: H100, cpus: 96, host_memory_gib: 1024, datasets: {c4: /nvme/c4}}]
""").inventories()[0]
    n = node_from_inventory(inv)
    assert (n.cpus, n.memory_gib, n.datasets) == (96, 1024, frozenset({"imagenet", "c4"}))


@settings(max_examples=60, deadline=None)
@given(cpus=st.lists(st.sampled_from([16, 32, 64, 96]), min_size=1, max_size=4),
       asks=st.lists(st.tuples(st.integers(1, 4), st.sampled_from([1.0, 2.0, 4.0, 8.0, 12.0])), max_size=12))
def test_placed_jobs_never_use_more_cpus_than_a_node_has(cpus: list[int], asks: list[tuple[int, float]]) -> None:
    cluster = Cluster(tuple(node(f"n{i}", cpus=c) for i, c in enumerate(cpus)))
    free = FreeGpus(cluster)
    used = dict.fromkeys((n.name for n in cluster.nodes), 0.0)
    for k, (gpus, per_gpu) in enumerate(asks):
        found = find_placement(cluster, free, job(f"j{k}", gpus=gpus, gpu=GpuRequest(cpus_per_gpu=per_gpu)))
        if not isinstance(found, Placement):
            continue
        for i, mask in free.masks_of(found):
            free.take(i, mask)
        for r in found.ranks:
            used[r.node] += per_gpu * len(r.gpus)
    assert all(used[n.name] <= (n.cpus or 0) for n in cluster.nodes), used
