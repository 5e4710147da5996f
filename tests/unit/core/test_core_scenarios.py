"""The issue's seed scenarios, each named after the behaviour it proves."""

from __future__ import annotations

from corral.core import (
    Cluster,
    Gpu,
    Node,
    Pending,
    Place,
    Preempt,
    ReasonCode,
    SchedulerConfig,
    Topology,
    TopologyLevel,
    schedule,
)

from .builders import job, running, snapshot


def test_64_rank_job_with_60_free_gpus_stays_pending_then_starts_whole():
    cluster = Cluster.uniform(8, 8, "H100")
    big = job("big", replicas=64, gpus=1)
    holder = running(job("holder", gpus=4), [("n007", (0, 1, 2, 3))])
    decisions = schedule(snapshot(cluster, [big], [holder]))
    assert len(decisions) == 1
    d = decisions[0]
    assert isinstance(d, Pending)
    assert d.reason.code is ReasonCode.GANG_DOES_NOT_FIT
    assert "60" in d.reason.message and "64" in d.reason.message
    assert not any(isinstance(x, Place) for x in decisions)  # no partial allocation

    decisions = schedule(snapshot(cluster, [big], []))
    assert len(decisions) == 1
    d = decisions[0]
    assert isinstance(d, Place)
    assert len(d.placement.ranks) == 64
    assert sorted(r.rank for r in d.placement.ranks) == list(range(64))
    gpus = {(r.node, g) for r in d.placement.ranks for g in r.gpus}
    assert len(gpus) == 64


def test_32_gpu_gang_starts_all_ranks_in_one_decision():
    cluster = Cluster.uniform(8, 8, "H100")
    gang = job("gang", replicas=4, gpus=8)
    decisions = schedule(snapshot(cluster, [gang]))
    assert [type(d) for d in decisions] == [Place]
    place = decisions[0]
    assert isinstance(place, Place)
    assert [len(r.gpus) for r in place.placement.ranks] == [8, 8, 8, 8]
    assert len(place.placement.nodes()) == 4  # one whole node per rank: tightest
    assert place.reason.code is ReasonCode.PLACED


def test_nvlink_gang_of_8_single_gpu_ranks_lands_in_one_domain_despite_fragmented_option():
    # four PCIe boxes with NVLink pairs (domains of 2), each with 4 GPUs free (fragmented
    # placement across nodes exists), and one DGX-like node whose 8 GPUs form one domain
    pcie = [Node(f"p{i}", tuple(Gpu(g, "H100", 80, g // 2) for g in range(8)), rack="r0", zone="z0") for i in range(4)]
    dgx = Node("dgx", tuple(Gpu(g, "H100", 80, 0) for g in range(8)), rack="r1", zone="z0")
    cluster = Cluster((*pcie, dgx))
    busy = [running(job(f"b{i}", gpus=4), [(f"p{i}", (0, 2, 4, 6))]) for i in range(4)]
    j = job("nv", replicas=8, gpus=1, topology=Topology(gang=TopologyLevel.NVLINK))
    [d] = schedule(snapshot(cluster, [j], busy))
    assert isinstance(d, Place)
    assert d.placement.nodes() == ("dgx",)
    assert sorted(g for r in d.placement.ranks for g in r.gpus) == list(range(8))


def test_nvlink_gang_that_no_domain_can_hold_is_topology_unsatisfiable():
    cluster = Cluster.uniform(4, 8, "H100", nvlink_domain_size=4)
    j = job("nv", replicas=8, gpus=1, topology=Topology(gang=TopologyLevel.NVLINK))
    [d] = schedule(snapshot(cluster, [j]))
    assert isinstance(d, Pending)
    assert d.reason.code is ReasonCode.TOPOLOGY_UNSATISFIABLE


def test_priority_1000_job_preempts_the_cheapest_low_priority_experiment_and_only_that():
    cluster = Cluster.uniform(2, 8, "H100")
    now = 10_000.0
    experiments = [
        # 8 GPUs, no checkpoint for 10,000 s: 80,000 GPU-s lost
        running(job("exp-old", gpus=8), [("n000", tuple(range(8)))], start=0.0),
        # 4 GPUs, checkpointed 100 s ago: 400 GPU-s lost (the cheapest)
        running(job("exp-cheap", gpus=4), [("n001", (0, 1, 2, 3))], start=5000.0, checkpoint=now - 100),
        # 4 GPUs, checkpointed 2,000 s ago: 8,000 GPU-s lost
        running(job("exp-mid", gpus=4), [("n001", (4, 5, 6, 7))], start=5000.0, checkpoint=now - 2000),
    ]
    urgent = job("urgent", gpus=4, priority=1000)
    [d] = schedule(snapshot(cluster, [urgent], experiments, now=now))
    assert isinstance(d, Preempt)
    assert d.victims == ("exp-cheap",)
    assert d.reason.code is ReasonCode.PREEMPTED_FOR_PRIORITY
    assert "400" in d.reason.message


def test_cheaper_victim_that_is_not_preemptible_or_too_young_is_never_chosen():
    cluster = Cluster.uniform(1, 8, "H100")
    now = 10_000.0
    run = [
        running(job("pinned", gpus=2, preemptible=False), [("n000", (0, 1))], start=now - 10),
        running(job("young", gpus=2, min_runtime_seconds=3600), [("n000", (2, 3))], start=now - 20),
        running(job("old", gpus=4), [("n000", (4, 5, 6, 7))], start=0.0),
    ]
    [d] = schedule(snapshot(cluster, [job("urgent", gpus=2, priority=1000)], run, now=now))
    assert isinstance(d, Preempt)
    assert d.victims == ("old",)


def test_a_job_preempted_twice_in_ten_minutes_is_spared_until_the_first_ages_out():
    """The chaos run's loop: a low-priority job restarted after each preemption was the cheapest
    victim again (no work to lose), preempted 3 times in 11 s. Two preemptions in the budget's
    window (600 s) spend it; the next preemptor takes another victim or waits."""
    cluster = Cluster.uniform(1, 8, "H100")
    now = 10_000.0
    looped = running(job("looped", gpus=4), [("n000", (0, 1, 2, 3))], start=now - 5,
                     preempted_at=(now - 300, now - 20))
    other = running(job("other", gpus=4), [("n000", (4, 5, 6, 7))], start=0.0)
    [d] = schedule(snapshot(cluster, [job("urgent", gpus=4, priority=1000)], [looped, other], now=now))
    assert isinstance(d, Preempt) and d.victims == ("other",)  # though `looped` loses less work

    [d] = schedule(snapshot(cluster, [job("urgent", gpus=8, priority=1000)], [looped, other], now=now))
    assert isinstance(d, Pending)  # the whole node would need `looped` too

    later = now + 301  # the preemption at now-300 is out of the window: one left in it
    [d] = schedule(snapshot(cluster, [job("urgent", gpus=8, priority=1000)], [looped, other], now=later))
    assert isinstance(d, Preempt) and d.victims == ("looped", "other")

    off = SchedulerConfig(preemption_budget=0)
    [d] = schedule(snapshot(cluster, [job("urgent", gpus=4, priority=1000)], [looped, other], now=now), off)
    assert isinstance(d, Preempt) and d.victims == ("looped",)


def test_a_priority_tie_never_preempts():
    cluster = Cluster.uniform(1, 8, "H100")
    run = [running(job("r", gpus=8, priority=5), [("n000", tuple(range(8)))])]
    [d] = schedule(snapshot(cluster, [job("p", gpus=8, priority=5)], run))
    assert isinstance(d, Pending)


def test_preemptor_is_not_preempting_again_a_job_it_already_preempted():
    cluster = Cluster.uniform(1, 8, "H100")
    run = [running(job("r", gpus=8), [("n000", tuple(range(8)))], preempted_by=frozenset({"p"}))]
    [d] = schedule(snapshot(cluster, [job("p", gpus=8, priority=9)], run))
    assert isinstance(d, Pending)


def test_preemption_is_not_attempted_when_victims_would_not_make_the_gang_fit():
    cluster = Cluster.uniform(2, 8, "H100")
    run = [
        running(job("low", gpus=4), [("n000", (0, 1, 2, 3))]),
        running(job("pinned", gpus=8, preemptible=False), [("n001", tuple(range(8)))]),
    ]
    # preempting 'low' frees n000 only: a 2x8 gang still cannot fit, so nobody is preempted
    [d] = schedule(snapshot(cluster, [job("big", replicas=2, gpus=8, priority=10)], run))
    assert isinstance(d, Pending)
    assert d.reason.code is ReasonCode.GANG_DOES_NOT_FIT


def test_fifo_policy_keeps_head_of_line_order():
    cluster = Cluster.uniform(1, 8, "H100")
    run = [running(job("r", gpus=4), [("n000", (0, 1, 2, 3))])]
    head = job("head", gpus=8, submit_time=1.0)
    small = job("small", gpus=1, submit_time=2.0)
    d1, d2 = schedule(snapshot(cluster, [head, small], run), SchedulerConfig.named("fifo"))
    assert isinstance(d1, Pending) and d1.job_id == "head"
    assert isinstance(d2, Pending) and d2.reason.code is ReasonCode.ORDERED_BEHIND
