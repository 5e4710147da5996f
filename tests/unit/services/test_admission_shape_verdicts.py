"""Admission's cluster-wide checks remembered per job shape (`corral.services.admission.feasibility`):
the same verdicts, messages included, as judging every job on its own, and judged again when the
cluster object changes."""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from corral import core
from corral.services.admission.feasibility import ShapeVerdicts
from corral.services.admission.service import cluster_checks
from tests.unit.core.test_core_properties import clusters, random_job


@settings(max_examples=200, deadline=None)
@given(st.lists(clusters(), min_size=1, max_size=3), st.integers(0, 2**32 - 1), st.integers(1, 40))
def test_remembered_verdicts_are_the_verdicts_of_each_job(cluster_list: list[core.Cluster], seed: int,
                                                           count: int) -> None:
    rng = random.Random(seed)
    verdicts = ShapeVerdicts(cluster_checks)
    for n in range(count):
        cluster = rng.choice(cluster_list)  # a node registered or left: another cluster object
        job = random_job(rng, n, float(n), ["a", "b/x"], simple=rng.random() < 0.3)
        assert verdicts(job, cluster) == cluster_checks(job, cluster), (job, cluster)


def test_a_shape_is_judged_once_per_cluster_object() -> None:
    calls: list[core.Job] = []

    def judge(job: core.Job, cluster: core.Cluster) -> bool:
        calls.append(job)
        return sum(len(n.gpus) for n in cluster.nodes) >= job.total_gpus

    small = core.Cluster((core.Node("n0", tuple(core.Gpu(i, "H100", 80, 0) for i in range(8)), "r0", "z0"),))
    verdicts = ShapeVerdicts(judge)
    jobs = [core.Job(id=f"j{i}", queue="q", replicas=2, gpus_per_replica=4, submit_time=float(i), priority=i)
            for i in range(100)]
    assert all(verdicts(j, small) for j in jobs) and len(calls) == 1
    assert not verdicts(core.Job(id="big", queue="q", replicas=4, gpus_per_replica=4, submit_time=0.0), small)
    assert len(calls) == 2
    smaller = core.Cluster(small.nodes[:0])
    assert not verdicts(jobs[0], smaller) and len(calls) == 3  # another cluster: judged again


@settings(max_examples=100, deadline=None)
@given(clusters(), st.integers(0, 2**32 - 1))
def test_a_lost_node_counts_for_what_can_ever_fit(cluster: core.Cluster, seed: int) -> None:
    """A rejection is final and a lost node may come back: while nodes are lost (an agent process
    restarting), admission judges the shape of every registered node, as if all were back."""
    rng = random.Random(seed)
    lost = core.Cluster(tuple(dataclasses.replace(n, state=core.NodeState.LOST) if rng.random() < 0.7 else n
                              for n in cluster.nodes))
    back = core.Cluster(tuple(dataclasses.replace(n, state=core.NodeState.READY) for n in cluster.nodes))
    for n in range(20):
        job = random_job(rng, n, float(n), ["a", "b/x"], simple=rng.random() < 0.3)
        assert cluster_checks(job, lost) == cluster_checks(job, back), job


def test_a_two_node_gang_is_not_refused_while_one_of_two_nodes_is_lost() -> None:
    gpus = tuple(core.Gpu(i, "H100", 80, 0) for i in range(8))
    cluster = core.Cluster((core.Node("n0", gpus, "r0", "z0"),
                            core.Node("n1", gpus, "r0", "z0", state=core.NodeState.LOST)))
    gang = core.Job(id="g", queue="q", replicas=2, gpus_per_replica=8, submit_time=0.0)
    assert cluster_checks(gang, cluster) == (None, None)
