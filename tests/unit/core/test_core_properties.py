"""Property tests: random clusters, queue trees and job streams, invariants checked after every cycle.

A small simulator drives `schedule`: each cycle new jobs arrive, decisions are applied (Place
starts the gang, Preempt marks victims as preempting, and they release their GPUs the next cycle,
returning to the queue with the preemptor remembered), and jobs finish when their estimate runs
out. After every cycle the decisions are checked against the issue's invariants.
"""

from __future__ import annotations

import dataclasses
import os
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import (
    Cluster,
    FreeGpus,
    Gpu,
    GpuRequest,
    Job,
    Node,
    NodeState,
    Pending,
    PendingJob,
    Place,
    Placement,
    Preempt,
    QueueConfig,
    ReasonCode,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    Topology,
    TopologyLevel,
    find_placement,
    schedule,
)
from corral.core.levels import running_level, started_promotion, waiting_level
from corral.core.preemption import budget_spent
from corral.core.preemption.eligibility import defragments

# CORE_PROPERTY_EXAMPLES=2000 for a longer hunt; the default keeps the suite fast
SETTINGS = settings(
    max_examples=int(os.environ.get("CORE_PROPERTY_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
POLICIES = ["corral", "fifo", "priority", "backfill", "las", "fair-las", "fair-las-order", "fair-las-defrag",
            "fair-las-front", "fair-las-protect"]
# fair-las with service levels a dozen 10-second cycles cross (its own are GPU-hours)
SMALL_LEVELS = (40.0, 160.0)


def named(policy: str) -> SchedulerConfig:
    """`SchedulerConfig.named`, with fair-las's levels small enough for these short histories;
    fair-las-order: fair-las without `promotion_resets_level` (a promotion moves only the order);
    fair-las-defrag: with `defragment`; fair-las-front: without `promotion_arrives` (a promoted job leads its queue);
    fair-las-protect: with `level_protection_seconds` a cycle long and a count of 3 (`protection`)."""
    if policy == "fair-las-order":
        return dataclasses.replace(named("fair-las"), promotion_resets_level=False)
    if policy == "fair-las-defrag":
        return dataclasses.replace(named("fair-las"), defragment=True)
    if policy == "fair-las-front":
        return dataclasses.replace(named("fair-las"), promotion_arrives=False)
    if policy == "fair-las-protect":
        return dataclasses.replace(named("fair-las"), level_protection_seconds=10.0, level_protection_count=3)
    config = SchedulerConfig.named(policy)
    return dataclasses.replace(config, las_thresholds=SMALL_LEVELS) if policy == "fair-las" else config


# -- generators -------------------------------------------------------------------------------------


@st.composite
def clusters(draw: st.DrawFn, ready_only: bool = False) -> Cluster:
    n = draw(st.integers(1, 6))
    per_rack = draw(st.integers(1, 3))
    racks_per_zone = draw(st.integers(1, 2))
    nodes = []
    for i in range(n):
        size = draw(st.sampled_from([2, 4, 8]))
        domain = draw(st.sampled_from([d for d in (1, 2, 4, 8) if d <= size]))
        model = draw(st.sampled_from(["H100", "H100", "A100"]))
        memory = 80 if model == "H100" else draw(st.sampled_from([40, 80]))
        state = NodeState.READY
        if not ready_only:
            state = draw(st.sampled_from([NodeState.READY] * 6 + [NodeState.DRAINING, NodeState.LOST]))
        rack = i // per_rack
        gpus = tuple(Gpu(g, model, memory, g // domain) for g in range(size))
        nodes.append(Node(f"n{i}", gpus, f"r{rack}", f"z{rack // racks_per_zone}", state))
    return Cluster(tuple(nodes))


@st.composite
def queue_trees(draw: st.DrawFn, capacity: int, flat: bool = False) -> tuple[QueueConfig, ...]:
    names = ["a", "b", "c"][: draw(st.integers(1, 3))]
    if not flat and draw(st.booleans()):
        names += ["a/x", "a/y"]
    left = capacity
    out = []
    for name in names:
        if "/" in name or (name == "a" and "a/x" in names):
            guar = 0 if "/" not in name else draw(st.integers(0, max(0, capacity // 4)))
        else:
            guar = draw(st.integers(0, max(0, left)))
        left -= guar
        max_gpus = draw(st.one_of(st.none(), st.integers(guar, guar + capacity)))
        lend = None if flat else draw(st.one_of(st.none(), st.integers(0, guar)))
        out.append(QueueConfig(name, guar, max_gpus, lend, draw(st.sampled_from([0.5, 1.0, 2.0]))))
    if not flat and "a/x" in names:
        # the parent's guarantee covers its children's
        kids = sum(q.guaranteed_gpus for q in out if q.name.startswith("a/"))
        out = [
            dataclasses.replace(q, guaranteed_gpus=max(q.guaranteed_gpus, kids), max_gpus=None) if q.name == "a" else q
            for q in out
        ]
    return tuple(out)


def random_job(rng: random.Random, n: int, t: float, queues: list[str], simple: bool) -> Job:
    replicas = rng.choice([1, 1, 1, 2, 3, 4])
    gpr = 1 if simple else rng.choice([1, 1, 2, 4, 8])
    topo = Topology()
    gpu = None
    if not simple:
        r = rng.random()
        if r < 0.15:
            topo = Topology(gang=rng.choice(list(TopologyLevel)))
        elif r < 0.3:
            topo = Topology(replica=TopologyLevel.NVLINK, prefer=rng.choice([None, TopologyLevel.RACK]))
        if rng.random() < 0.1:
            gpu = GpuRequest(model=rng.choice(["H100", "A100"]), min_memory_gib=rng.choice([None, 80]))
    return Job(
        id=f"j{n}",
        queue=rng.choice(queues),
        replicas=replicas,
        gpus_per_replica=gpr,
        submit_time=t,
        priority=rng.choice([0, 0, 1, 5]),
        gpu=gpu,
        topology=topo,
        preemptible=simple or rng.random() < 0.8,
        min_runtime_seconds=0 if simple else rng.choice([0, 0, 25]),
        estimated_runtime_seconds=rng.choice([None, 15.0, 40.0, 100.0]),
    )


# -- the simulator ---------------------------------------------------------------------------------


def simulate(cluster, queues, config, seed, cycles, simple, check):
    rng = random.Random(seed)
    names = [q.name for q in queues] + ([] if simple else ["ghost"])
    pending: dict[str, PendingJob] = {}
    running: dict[str, RunningJob] = {}
    n = 0
    for c in range(cycles):
        now = 10.0 * c
        # preempted jobs release their GPUs and go back to the queue; finished jobs leave
        for r in list(running.values()):
            end = r.expected_end()
            if r.preempting:
                del running[r.job.id]
                pending[r.job.id] = PendingJob(r.job, r.attained(now), r.preempted_by, r.preempted_at, now,
                                             now - r.start_time)
            elif end is not None and end <= now:
                del running[r.job.id]
            elif c % 3 == 0:  # a checkpoint now and then: FAIR_LAS may move such a job (`defragments`)
                running[r.job.id] = dataclasses.replace(r, last_checkpoint_time=now)
        for _ in range(rng.randint(0, 4)):
            j = random_job(rng, n, now, names, simple)
            pending[j.id] = PendingJob(j)
            n += 1
        snap = Snapshot(now, cluster, queues, tuple(pending.values()), tuple(running.values()))
        decisions = schedule(snap, config)
        check(snap, config, decisions)
        for d in decisions:
            if isinstance(d, Place):
                p = pending.pop(d.job_id)
                running[d.job_id] = RunningJob(
                    p.job, d.placement, now, attained_gpu_seconds=p.attained_gpu_seconds, preempted_by=p.preempted_by,
                    preempted_at=p.preempted_at, promoted_service=started_promotion(p, config, now),
                )
            elif isinstance(d, Preempt):
                for v in d.victims:
                    r = running[v]
                    running[v] = dataclasses.replace(r, preempting=True, preempted_by=r.preempted_by | {d.job_id},
                                                     preempted_at=(*r.preempted_at, now))
                if simple:  # victims release at once; their preemptor waits for the next cycle
                    for v in d.victims:
                        r = running.pop(v)
                        pending[v] = PendingJob(r.job, r.attained(now), r.preempted_by, r.preempted_at, now,
                                         now - r.start_time)


# -- invariants ------------------------------------------------------------------------------------


def _path(name: str) -> list[str]:
    parts = name.split("/")
    return ["/".join(parts[:i]) for i in range(len(parts), 0, -1)]


def check_invariants(snap: Snapshot, config: SchedulerConfig, decisions) -> None:
    cluster = snap.cluster
    pend = {p.job.id: p for p in snap.pending}
    run = {r.job.id: r for r in snap.running}
    # one decision per pending job
    assert sorted(d.job_id for d in decisions) == sorted(pend)
    # determinism: same snapshot -> same decisions; input order does not matter either
    assert schedule(snap, config) == decisions
    shuffled = dataclasses.replace(snap, pending=tuple(reversed(snap.pending)), running=tuple(reversed(snap.running)))
    assert schedule(shuffled, config) == decisions

    used: set[tuple[str, int]] = set()
    for r in snap.running:
        for rank in r.placement.ranks:
            for g in rank.gpus:
                assert (rank.node, g) not in used
                used.add((rank.node, g))
    held: dict[str, int] = {}
    for r in snap.running:
        for q in _path(r.job.queue):
            held[q] = held.get(q, 0) + r.job.total_gpus
    victims_seen: set[str] = set()
    placed_jobs = []
    for d in decisions:
        job = pend[d.job_id].job
        if isinstance(d, Place):
            placed_jobs.append(d)
            ranks = d.placement.ranks
            # the whole gang, every rank its GPUs
            assert [r.rank for r in ranks] == list(range(job.replicas))
            assert all(len(r.gpus) == job.gpus_per_replica for r in ranks)
            for r in ranks:
                node = cluster.node(r.node)
                assert node.state is NodeState.READY
                for g in r.gpus:
                    gpu = node.gpu(g)  # exists
                    assert job.gpu is None or job.gpu.matches(gpu)
                    # no GPU allocated twice
                    assert (r.node, g) not in used, f"GPU {r.node}:{g} allocated twice"
                    used.add((r.node, g))
                if job.topology.replica is TopologyLevel.NVLINK:
                    assert len({node.gpu(g).nvlink_domain for g in r.gpus}) == 1
            _check_gang_topology(cluster, job, d.placement)
            for q in _path(job.queue):
                held[q] = held.get(q, 0) + job.total_gpus
        elif isinstance(d, Preempt):
            p = pend[d.job_id]
            assert d.victims, "a Preempt names its victims"
            for v in d.victims:
                r = run[v]
                assert v not in victims_seen
                victims_seen.add(v)
                assert r.job.preemptible, "non-preemptible job chosen as victim"
                assert not r.preempting
                assert snap.now - r.start_time >= r.job.min_runtime_seconds
                assert job.id not in r.preempted_by and v not in p.preempted_by, "preemption loop"
                # the budget: never a victim when preempted `preemption_budget` times within the window
                recent = [t for t in r.preempted_at if snap.now - t < config.preemption_budget_seconds]
                assert config.preemption_budget == 0 or len(recent) < config.preemption_budget, (
                    f"{v} preempted at {r.preempted_at} and again at {snap.now}: a preemption loop")
                if r.job.queue == job.queue:
                    th = config.las_thresholds
                    outserved = running_level(r, th, snap.now) > waiting_level(p, config, snap.now)
                    assert (r.job.priority < job.priority or config.order.value == "las"
                            or (config.order.value == "fairlas" and outserved))
                    if r.job.priority >= job.priority and r.promoted_service is not None:
                        # started promoted: no level victim before one level's service since
                        assert r.attained(snap.now) - r.promoted_service >= th[0]
                else:
                    assert config.reclaim or config.order.value == "las" or defragments(config, p, r, snap.now)
                    if d.reason.code is ReasonCode.PREEMPTED_TO_DEFRAGMENT:
                        assert defragments(config, p, r, snap.now), f"{v} moved for {job.id}"
    # no queue exceeds max_gpus
    for q in snap.queues:
        if q.max_gpus is not None:
            assert held.get(q.name, 0) <= q.max_gpus, f"queue {q.name} over max_gpus"
    # never preempt unless the preemptor fits once the victims are gone (simulated independently)
    all_victims = {v for d in decisions if isinstance(d, Preempt) for v in d.victims}
    for d in decisions:
        if isinstance(d, Preempt):
            # GPUs of every victim of this cycle and of jobs already preempting are on their way out
            gone = all_victims | {r.job.id for r in snap.running if r.preempting}
            holders = [r for r in snap.running if r.job.id not in gone]
            holders += [RunningJob(pend[x.job_id].job, x.placement, snap.now) for x in placed_jobs]
            free = FreeGpus.from_running(cluster, holders)
            assert isinstance(find_placement(cluster, free, pend[d.job_id].job), Placement)


def _check_gang_topology(cluster: Cluster, job: Job, placement: Placement) -> None:
    level = job.topology.gang
    if level is None:
        return
    nodes = [cluster.node(r.node) for r in placement.ranks]
    if level is TopologyLevel.NVLINK:
        domains = {(r.node, cluster.node(r.node).gpu(g).nvlink_domain) for r in placement.ranks for g in r.gpus}
        assert len(domains) == 1
    elif level is TopologyLevel.NODE:
        assert len({n.name for n in nodes}) == 1
    elif level is TopologyLevel.RACK:
        assert len({n.rack for n in nodes}) == 1
    elif level is TopologyLevel.ZONE:
        assert len({n.zone for n in nodes}) == 1


def check_guarantee(snap: Snapshot, config: SchedulerConfig, decisions) -> None:
    """A queue under its guarantee with a fitting job is never left waiting while a borrower runs on
    its quota: it gets a Place or a Preempt (or waits for GPUs already being released)."""
    check_invariants(snap, config, decisions)
    guar = {q.name: q.guaranteed_gpus for q in snap.queues}
    pend = {p.job.id: p for p in snap.pending}
    victims = {v for d in decisions if isinstance(d, Preempt) for v in d.victims}
    # bounds that hold at every job's turn in the cycle: `usage` is an upper bound of what each
    # queue held or was promised, `lasting` a lower bound of what borrowers held (non-victims)
    usage: dict[str, int] = {}
    lasting: dict[str, int] = {}
    free = snap.cluster.usable_gpus
    for r in snap.running:
        free -= r.job.total_gpus
        usage[r.job.queue] = usage.get(r.job.queue, 0) + r.job.total_gpus
        if r.job.id not in victims:
            lasting[r.job.queue] = lasting.get(r.job.queue, 0) + r.job.total_gpus
    for d in decisions:
        holds = isinstance(d, Place | Preempt) or d.reason.code is ReasonCode.WAITING_FOR_PREEMPTION
        if holds:  # GPUs placed, or promised to a preemptor or to a job waiting for released GPUs
            j = pend[d.job_id].job
            usage[j.queue] = usage.get(j.queue, 0) + j.total_gpus
        if isinstance(d, Place):
            free -= d.placement.gpu_count
        elif isinstance(d, Preempt):
            free -= pend[d.job_id].job.total_gpus  # at most this many free GPUs are promised to it
    reserved = 0  # free GPUs an entitled job's backfill reservation keeps from the jobs after it
    for d in decisions:
        if not isinstance(d, Pending) or d.reason.code in (
            ReasonCode.WAITING_FOR_PREEMPTION,
            # max_gpus is a hard ceiling that still counts victims until they release their GPUs
            ReasonCode.MAX_GPUS_EXCEEDED,
        ):
            continue
        p = pend[d.job_id]
        j = p.job
        kept = reserved  # this job is checked against the reservations made before it
        details = dict(d.reason.details)
        holder = "shadow_time" in details and d.reason.code is not ReasonCode.RESERVED_FOR
        if holder and usage.get(j.queue, 0) + j.total_gpus <= guar[j.queue]:
            # a guaranteed reservation holder keeps its GPUs even from other guaranteed jobs
            reserved = int(details["reserved_gpus"])
        if usage.get(j.queue, 0) + j.total_gpus > guar[j.queue]:
            continue
        reclaimable = 0
        for w in guar:
            over = lasting.get(w, 0) - guar[w]
            if w == j.queue or over <= 0:
                continue
            eligible = sum(
                r.job.total_gpus
                for r in snap.running
                if r.job.queue == w
                and r.job.id not in victims
                and not r.preempting
                and r.job.preemptible
                and snap.now - r.start_time >= r.job.min_runtime_seconds
                and not budget_spent(r.preempted_at, snap.now, config)
                and j.id not in r.preempted_by
                and r.job.id not in p.preempted_by
            )
            reclaimable += min(eligible, over)
        if reclaimable == 0:
            continue  # no borrower holds reclaimable GPUs: waiting is not this invariant's concern
        if max(free - kept, 0) + reclaimable >= j.total_gpus:
            _dump(snap, decisions)
        assert max(free - kept, 0) + reclaimable < j.total_gpus, (
            f"{j.id} in {j.queue} is within its guarantee and could reclaim "
            f"{reclaimable} GPUs ({free} free) but got {d.reason}"
        )


def _dump(snap: Snapshot, decisions) -> None:
    """Print the failing cycle (pytest shows it with the failure)."""
    print("now", snap.now, [(q.name, q.guaranteed_gpus, q.max_gpus) for q in snap.queues])
    for r in snap.running:
        print("  running", r.job.id, r.job.queue, r.job.priority, r.placement.gpus_by_node(), r.preempted_by)
    for p in snap.pending:
        print("  pending", p.job.id, p.job.queue, p.job.priority, p.job.total_gpus, p.preempted_by)
    for d in decisions:
        print("  decision", d)


# -- the properties --------------------------------------------------------------------------------


@SETTINGS
@given(data=st.data(), policy=st.sampled_from(POLICIES), seed=st.integers(0, 2**16))
def test_every_cycle_keeps_the_scheduling_invariants(data, policy, seed):
    cluster = data.draw(clusters())
    queues = data.draw(queue_trees(max(cluster.usable_gpus, 1)))
    simulate(cluster, queues, named(policy), seed, cycles=12, simple=False, check=check_invariants)


@SETTINGS
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_queue_under_guarantee_is_never_left_waiting_while_a_borrower_holds_its_quota(data, seed):
    cluster = data.draw(clusters(ready_only=True))
    queues = data.draw(queue_trees(cluster.usable_gpus, flat=True))
    simulate(cluster, queues, SchedulerConfig(), seed, cycles=12, simple=True, check=check_guarantee)
