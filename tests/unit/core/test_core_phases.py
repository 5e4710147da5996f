"""The phases the live services call on their own: index, placement, victims, hierarchy."""

from __future__ import annotations

from corral.core import (
    Cluster,
    FreeGpus,
    Pending,
    PendingJob,
    Placement,
    Preempt,
    QueueConfig,
    QueueTree,
    QueueUsage,
    Reason,
    ReasonCode,
    SchedulerConfig,
    Statement,
    Topology,
    TopologyLevel,
    find_placement,
    quota_check,
    schedule,
    select_victims,
)

from .builders import job, running, snapshot


def test_statement_rollback_restores_the_index_exactly():
    cluster = Cluster.uniform(4, 8, "H100", nvlink_domain_size=4)
    fi = FreeGpus.from_mapping(cluster, {"n000": [0, 1, 2], "n002": range(8)})
    before = (fi.as_mapping(), fi.total_free, list(fi.rack_free))
    stmt = Statement(fi)
    stmt.take(fi.index_of["n002"], 0b1111)
    stmt.give(fi.index_of["n001"], 0b1)
    mark = stmt.mark()
    stmt.take(fi.index_of["n000"], 0b1)
    stmt.rollback_to(mark)
    assert fi.free[fi.index_of["n000"]] == 0b111
    stmt.rollback()
    assert (fi.as_mapping(), fi.total_free, list(fi.rack_free)) == before


def test_find_placement_works_on_an_explicit_free_gpu_map_and_leaves_it_untouched():
    cluster = Cluster.uniform(3, 8, "H100")
    fi = FreeGpus.from_mapping(cluster, {"n000": [0, 1], "n001": [0, 1, 2, 3, 4, 5], "n002": range(8)})
    snapshot_before = fi.as_mapping()
    found = find_placement(cluster, fi, job("j", replicas=1, gpus=6))
    assert isinstance(found, Placement)
    assert found.gpus_by_node() == {"n001": (0, 1, 2, 3, 4, 5)}  # best fit keeps n002 whole
    assert fi.as_mapping() == snapshot_before


def test_draining_and_lost_nodes_get_no_new_work():
    from dataclasses import replace

    from corral.core import NodeState

    base = Cluster.uniform(3, 8, "H100")
    cluster = Cluster(
        (
            replace(base.nodes[0], state=NodeState.DRAINING),
            replace(base.nodes[1], state=NodeState.LOST),
            base.nodes[2],
        )
    )
    [d] = schedule(snapshot(cluster, [job("j", replicas=2, gpus=8)]))
    assert isinstance(d, Pending) and d.reason.code is ReasonCode.GANG_DOES_NOT_FIT
    [d] = schedule(snapshot(cluster, [job("k", gpus=8)]))
    assert not isinstance(d, Pending) and d.placement.nodes() == ("n002",)


def test_replica_nvlink_keeps_each_rank_inside_one_domain():
    cluster = Cluster.uniform(2, 8, "H100", nvlink_domain_size=4)
    fi = FreeGpus.from_mapping(cluster, {"n000": [0, 1, 4, 5, 6, 7], "n001": [0, 1, 2, 4, 5, 6]})
    found = find_placement(cluster, fi, job("j", gpus=4, topology=Topology(replica=TopologyLevel.NVLINK)))
    assert isinstance(found, Placement)
    assert found.gpus_by_node() == {"n000": (4, 5, 6, 7)}


def test_gang_spreads_over_as_few_racks_as_possible():
    cluster = Cluster.uniform(8, 8, "H100", nodes_per_rack=2)
    found = find_placement(cluster, FreeGpus(cluster), job("j", replicas=5, gpus=8))
    assert isinstance(found, Placement)
    assert len({cluster.node(n).rack for n in found.nodes()}) == 3


def test_select_victims_names_the_cheapest_sufficient_set():
    cluster = Cluster.uniform(1, 8, "H100")
    run = [
        running(job("a", gpus=4), [("n000", (0, 1, 2, 3))], start=0.0),
        running(job("b", gpus=2), [("n000", (4, 5))], start=900.0),
        running(job("c", gpus=2), [("n000", (6, 7))], start=950.0),
    ]
    snap = snapshot(cluster, [job("p", gpus=4, priority=3)], run)
    assert select_victims(snap, snap.pending[0]) == ("b", "c")  # 150 GPU-s lost vs 4,000


def test_select_victims_explains_when_nobody_may_be_preempted():
    cluster = Cluster.uniform(1, 8, "H100")
    run = [running(job("a", gpus=8, priority=7), [("n000", tuple(range(8)))])]
    snap = snapshot(cluster, [job("p", gpus=4, priority=3)], run)
    reason = select_victims(snap, snap.pending[0])
    assert isinstance(reason, Reason) and reason.code is ReasonCode.GANG_DOES_NOT_FIT


def test_child_queue_reclaims_from_a_sibling_subtree_that_borrows():
    cluster = Cluster.uniform(2, 8, "H100")
    queues = [
        QueueConfig("research", guaranteed_gpus=8),
        QueueConfig("research/nlp", guaranteed_gpus=8),
        QueueConfig("prod", guaranteed_gpus=8),
    ]
    run = [
        running(job("p1", gpus=8, queue="prod"), [("n000", tuple(range(8)))]),
        running(job("p2", gpus=8, queue="prod"), [("n001", tuple(range(8)))], start=500.0),
    ]
    [d] = schedule(snapshot(cluster, [job("n1", gpus=8, queue="research/nlp")], run, queues))
    assert isinstance(d, Preempt) and d.victims == ("p2",)
    assert d.reason.code is ReasonCode.RECLAIMED_FOR_GUARANTEE


def test_quota_check_is_callable_with_precomputed_usage():
    cluster = Cluster.uniform(2, 8, "H100")
    queues = [QueueConfig("a", guaranteed_gpus=8, max_gpus=8)]
    run = [running(job("r", gpus=8, queue="a"), [("n000", tuple(range(8)))])]
    snap = snapshot(cluster, [job("j", queue="a")], run, queues)
    tree = QueueTree.of(snap)
    usage = QueueUsage.of(tree, snap.running)
    reason = quota_check(snap, snap.pending[0].job, usage, tree=tree)
    assert reason is not None and reason.detail("max_gpus") == 8


def test_same_snapshot_same_decisions_bit_for_bit():
    cluster = Cluster.uniform(16, 8, "H100", nodes_per_rack=4, nvlink_domain_size=4)
    pending = [
        PendingJob(job(f"j{i}", replicas=1 + i % 4, gpus=1 << (i % 4), submit_time=i % 5, priority=i % 3))
        for i in range(60)
    ]
    snap = snapshot(cluster, pending)
    first = schedule(snap, SchedulerConfig())
    assert all(schedule(snap, SchedulerConfig()) == first for _ in range(3))
    assert repr(schedule(snap)) == repr(first)


def test_nvlink_gang_of_single_gpu_ranks_never_straddles_two_domains():
    cluster = Cluster.uniform(1, 8, "H100", nvlink_domain_size=2)
    # domain 0 has one free GPU (best fit for a lone rank), domain 1 has two
    fi = FreeGpus.from_mapping(cluster, {"n000": [0, 2, 3]})
    found = find_placement(cluster, fi, job("j", replicas=2, gpus=1, topology=Topology(gang=TopologyLevel.NVLINK)))
    assert isinstance(found, Placement)
    assert found.gpus_by_node() == {"n000": (2, 3)}


def test_a_snapshot_with_a_gpu_held_twice_is_rejected_with_a_clear_error():
    import pytest

    cluster = Cluster.uniform(1, 8, "H100")
    run = [running(job("a", gpus=2), [("n000", (0, 1))]), running(job("b", gpus=2), [("n000", (1, 2))])]
    with pytest.raises(ValueError, match=r"'b' holds GPUs \(1,\) of node 'n000'"):
        schedule(snapshot(cluster, [job("p")], run))
    with pytest.raises(ValueError, match="not in the cluster"):
        schedule(snapshot(cluster, [job("p")], [running(job("c"), [("gone", (0,))])]))
    with pytest.raises(ValueError, match="unique"):
        schedule(snapshot(cluster, [job("a")], [running(job("a"), [("n000", (0,))])]))
