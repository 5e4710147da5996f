"""GPUs out of service (`Node.out_of_service`: unhealthy, or drained by an admin) are never free.

Random clusters, running jobs (some of them on GPUs that then went out of service) and waiting
jobs; after every cycle: no GPU is given twice, no decision places a rank on a GPU out of service
(nor does a preemption plan count on one), and the cycle keeps every other invariant.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.core import (
    Cluster,
    FreeGpus,
    Node,
    PendingJob,
    Place,
    Preempt,
    QueueConfig,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    schedule,
)
from corral.core.gpuset import Statement, mask_of
from corral.core.placement import idle_index, shape_index
from tests.unit.core.builders import job, running, snapshot
from tests.unit.core.test_core_properties import POLICIES, SETTINGS, check_invariants, clusters, named, random_job


def _with_out_of_service(cluster: Cluster, data: st.DataObject) -> Cluster:
    nodes = []
    for n in cluster.nodes:
        out = data.draw(st.sets(st.sampled_from([g.index for g in n.gpus]), max_size=len(n.gpus)))
        nodes.append(dataclasses.replace(n, out_of_service=frozenset(out)))
    return dataclasses.replace(cluster, nodes=tuple(nodes))


def _out(cluster: Cluster) -> set[tuple[str, int]]:
    return {(n.name, g) for n in cluster.nodes for g in n.out_of_service}


@SETTINGS
@given(data=st.data(), policy=st.sampled_from(POLICIES), seed=st.integers(0, 2**16))
def test_no_gpu_twice_and_no_gpu_out_of_service_is_ever_chosen(data: st.DataObject, policy: str, seed: int) -> None:
    healthy = data.draw(clusters())
    config = named(policy)
    rng = random.Random(seed)
    queues = (QueueConfig("a", guaranteed_gpus=healthy.usable_gpus // 2), QueueConfig("b"))
    # jobs that were placed while every GPU was in service
    first = [PendingJob(random_job(rng, n, float(n), ["a", "b"], simple=False)) for n in range(rng.randint(0, 8))]
    runs: list[RunningJob] = []
    for d in schedule(Snapshot(0.0, healthy, queues, tuple(first), ()), config):
        if isinstance(d, Place):
            runs.append(RunningJob(next(p.job for p in first if p.job.id == d.job_id), d.placement, 0.0))
    # then GPUs go out of service, some under those jobs; new jobs arrive
    cluster = _with_out_of_service(healthy, data)
    out = _out(cluster)
    pending = [PendingJob(dataclasses.replace(random_job(rng, 100 + n, 50.0 + n, ["a", "b"], simple=False),
                                              priority=rng.choice([0, 5, 9])))
               for n in range(rng.randint(1, 10))]
    snap = Snapshot(100.0, cluster, queues, tuple(pending), tuple(runs))
    decisions = schedule(snap, config)
    check_invariants(snap, config, decisions)  # one decision each, deterministic, no GPU twice, ...
    for d in decisions:
        if isinstance(d, Place):
            chosen = {(r.node, g) for r in d.placement.ranks for g in r.gpus}
            assert not chosen & out, f"{d.job_id} placed on GPUs out of service {sorted(chosen & out)}"
    # a preemption counts only on GPUs that are in service once its victims (and every victim
    # of this cycle, and the jobs placed now) are gone: counted here by hand, not by the index
    gone = {v for d in decisions if isinstance(d, Preempt) for v in d.victims}
    held = {(r.node, g) for x in runs if x.job.id not in gone for r in x.placement.ranks for g in r.gpus}
    held |= {(r.node, g) for d in decisions if isinstance(d, Place) for r in d.placement.ranks for g in r.gpus}
    room = {(n.name, g.index) for n in cluster.nodes if n.state.value == "ready" for g in n.gpus} - held - out
    for d in decisions:
        if isinstance(d, Preempt):
            need = next(p.job for p in pending if p.job.id == d.job_id).total_gpus
            assert len(room) >= need, f"{d.job_id} preempts for {need} GPUs; only {len(room)} in service would be free"

@SETTINGS
@given(data=st.data())
def test_a_gpu_out_of_service_is_never_free_whoever_gives_it_back(data: st.DataObject) -> None:
    cluster = _with_out_of_service(data.draw(clusters(ready_only=True)), data)
    fi = FreeGpus(cluster)
    stmt = Statement(fi)
    for i, n in enumerate(cluster.nodes):
        usable = mask_of(g.index for g in n.gpus) & ~mask_of(n.out_of_service)
        assert fi.free[i] == usable
        stmt.take(i, usable)
        stmt.give(i, mask_of(g.index for g in n.gpus) if data.draw(st.booleans()) else usable)
        assert fi.free[i] == usable, "a holder leaving does not bring a GPU out of service back"
    stmt.rollback()
    assert fi.free == FreeGpus(cluster).free
    # the cluster's shape (admission's checks, whose rejection is final) still counts them: they come back
    assert idle_index(cluster).total_free == sum(len(n.gpus) for n in cluster.nodes)
    assert shape_index(cluster).total_free == sum(len(n.gpus) for n in cluster.nodes)


def test_an_8_gpu_gang_waits_while_one_gpu_of_the_node_is_out_of_service() -> None:
    node = Cluster.uniform(1, 8, "H100").nodes[0]
    cluster = Cluster((dataclasses.replace(node, out_of_service=frozenset({3})),))
    (whole,) = schedule(snapshot(cluster, [job("whole", gpus=8)]), SchedulerConfig())
    assert not isinstance(whole, Place | Preempt), whole
    (seven,) = schedule(snapshot(cluster, [job("seven", gpus=7)]), SchedulerConfig())
    assert isinstance(seven, Place) and sorted(seven.placement.ranks[0].gpus) == [0, 1, 2, 4, 5, 6, 7]


def test_a_job_holding_a_gpu_out_of_service_frees_only_the_others_when_preempted() -> None:
    node = Cluster.uniform(1, 4, "H100").nodes[0]
    cluster = Cluster((dataclasses.replace(node, out_of_service=frozenset({0})),))
    low = running(job("low", gpus=4, priority=0), [(node.name, (0, 1, 2, 3))])
    config = SchedulerConfig.named("priority")
    (four,) = schedule(snapshot(cluster, [job("high", gpus=4, priority=9)], [low]), config)
    assert not isinstance(four, Place | Preempt), f"4 GPUs never come back while GPU 0 is out: {four}"
    (three,) = schedule(snapshot(cluster, [job("three", gpus=3, priority=9)], [low]), config)
    assert isinstance(three, Preempt) and three.victims == ("low",), three

def test_why_names_the_gpu_whose_return_would_place_the_job() -> None:
    from corral.core.hints import HintKind, describe_event, unblock
    from corral.core.whatif import GpusBack

    node = Cluster.uniform(1, 8, "H100").nodes[0]
    cluster = Cluster((dataclasses.replace(node, out_of_service=frozenset({3})),))
    snap = snapshot(cluster, [job("whole", gpus=8)])
    hint = unblock(snap, "whole")
    assert hint.kind is HintKind.EVENTS and hint.events == (GpusBack(node.name, (3,)),)
    assert describe_event(hint.events[0], hint, snap.now) == (
        f"GPU {node.name}:3 back in service (unhealthy or drained now)")


def test_a_node_refuses_out_of_service_gpus_it_does_not_have() -> None:
    node = Cluster.uniform(1, 2, "H100").nodes[0]
    with pytest.raises(ValueError, match=r"out_of_service names GPUs \[5\]"):
        Node(node.name, node.gpus, node.rack, node.zone, out_of_service=frozenset({5}))
