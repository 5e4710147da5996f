"""Under FAIR_LAS a waiting gang whose GPUs lie idle in fragments may move smaller jobs of other
queues that checkpointed lately (`eligibility.defragments`): they restart on idle GPUs elsewhere.
The plan is checked against its plain definition (idle GPUs add up to the gang, every moved job is
`defragments`-eligible and fits, largest first, once the victims are gone and the gang placed), and
the candidate list's shortcut (`Candidates.for_job` given the idle count) against the victim rule."""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given
from hypothesis import strategies as st

from corral.core import Cluster, Pending, PendingJob, Preempt, QueueConfig, RunningJob, SchedulerConfig, schedule
from corral.core.decisions import ReasonCode
from corral.core.gpuset import FreeGpus
from corral.core.model import Placement, RankPlacement
from corral.core.ordering import tree_for
from corral.core.placement import placement_or_none
from corral.core.preemption import Candidates, PreemptionPlan, plan_preemption, statically_eligible, victim_kind
from corral.core.preemption.eligibility import defragmenting, defragments
from corral.core.quota import QueueUsage

from .builders import job, running, snapshot
from .test_core_properties import SETTINGS as _SETTINGS

SETTINGS = _SETTINGS.__class__(_SETTINGS, max_examples=400)
FAIR_LAS = dataclasses.replace(SchedulerConfig.named("fair-las"), defragment=True)
QUEUES = [QueueConfig("g", 0), QueueConfig("s", 24)]  # g borrows: no reclaim
NOW = 10_000.0


def _small(name: str, node: str, gpus: tuple[int, ...], checkpoint: float | None = NOW - 100.0) -> RunningJob:
    return running(job(name, gpus=len(gpus), queue="s"), [(node, gpus)], start=0.0, checkpoint=checkpoint)


def _decide(run: list[RunningJob], config: SchedulerConfig = FAIR_LAS, nodes: int = 2, also: tuple = ()) -> list:
    pending = [job("gang", gpus=8, queue="g"), *also]
    snap = snapshot(Cluster.uniform(nodes, 8, "H100"), pending, run, QUEUES, now=NOW)
    return schedule(snap, config)


def test_a_gang_moves_a_fresh_smaller_job_to_a_whole_node() -> None:
    """2x8: 4 GPUs of queue s on each node, 8 idle in two halves; the gang of g moves one of them."""
    run = [_small("s1", "n000", (0, 1, 2, 3)), _small("s2", "n001", (0, 1, 2, 3))]
    [d] = _decide(run)
    assert isinstance(d, Preempt) and d.reason.code is ReasonCode.PREEMPTED_TO_DEFRAGMENT
    assert len(d.victims) == 1
    for other in (SchedulerConfig.named("corral"), SchedulerConfig.named("fair-las")):  # the switch off
        [d] = _decide(run, other)
        assert isinstance(d, Pending)


def test_no_move_while_a_job_of_another_queue_waits() -> None:
    run = [_small("s1", "n000", (0, 1, 2, 3)), _small("s2", "n001", (0, 1, 2, 3))]
    decisions = _decide(run, also=(job("big", replicas=2, gpus=8, queue="s", submit_time=1.0),))
    gang = next(d for d in decisions if d.job_id == "gang")
    assert isinstance(gang, Pending)
    assert not any(isinstance(d, Preempt) and d.reason.code is ReasonCode.PREEMPTED_TO_DEFRAGMENT for d in decisions)


def test_no_move_of_a_job_not_checkpointed_lately_or_not_since_its_start() -> None:
    for checkpoint in (None, 0.0, NOW - 3600.0):
        run = [_small("s1", "n000", (0, 1, 2, 3), checkpoint), _small("s2", "n001", (0, 1, 2, 3), checkpoint)]
        [d] = _decide(run)
        assert isinstance(d, Pending), checkpoint


def test_no_move_when_the_moved_job_would_not_fit_elsewhere() -> None:
    """3x8: idle 4 + 3 + 1 = 8, but whichever job leaves, it finds no node with room for it."""
    run = [_small("s1", "n000", (0, 1, 2, 3)), _small("s2", "n001", (0, 1, 2, 3, 4)),
           _small("s3", "n002", (0, 1, 2, 3, 4, 5, 6))]
    [d] = _decide(run, nodes=3)
    assert isinstance(d, Pending)


def test_no_move_when_the_idle_gpus_do_not_add_up_to_the_gang() -> None:
    run = [_small("s1", "n000", (0, 1, 2, 3, 4)), _small("s2", "n001", (0, 1, 2, 3, 4))]
    [d] = _decide(run)
    assert isinstance(d, Pending)


def _world(seed: int, nodes: int) -> tuple[Cluster, list[RunningJob], list[PendingJob]]:
    """Random small jobs of queues a-c on `nodes` x 8, some checkpointed lately; a job `p` of a-c or
    g (guaranteed nothing: it never reclaims) waits, and maybe others of its queue or of g."""
    rng = random.Random(seed)
    cluster = Cluster.uniform(nodes, 8, "H100")
    free = {f"n{i:03d}": list(range(8)) for i in range(nodes)}
    run = []
    for n in range(rng.randint(1, 4 * nodes)):
        size = rng.choice([1, 1, 2, 4, 8])
        spots = [node for node, g in free.items() if len(g) >= size]
        if not spots:
            continue
        node = rng.choice(spots)
        gpus, free[node] = tuple(free[node][:size]), free[node][size:]
        start = rng.choice([0.0, 0.0, NOW - 200.0, NOW])
        checkpoint = rng.choice([None, start, NOW - 100.0, NOW - 100.0, NOW - 300.0, NOW - 1000.0])
        j = job(f"r{n}", gpus=size, queue=rng.choice("abc"), submit_time=start)
        run.append(RunningJob(j, Placement((RankPlacement(0, node, gpus),)), start, checkpoint))
    want, queue = rng.choice([2, 4, 8]), rng.choice("abcg")
    others = [PendingJob(job(f"w{n}", gpus=rng.choice([1, 8]), queue=rng.choice(["g", queue]), submit_time=NOW))
              for n in range(rng.choice([0, 0, 1, 2]))]
    return cluster, run, [PendingJob(job("p", gpus=want, queue=queue, submit_time=NOW)), *others]


@SETTINGS
@given(seed=st.integers(0, 2**20), nodes=st.integers(1, 4))
def test_a_plan_that_moves_jobs_keeps_the_plain_definition(seed: int, nodes: int) -> None:
    cluster, run, waiting = _world(seed, nodes)
    p = waiting[0]
    queues = (QueueConfig("a", 4 * nodes), QueueConfig("b", 2 * nodes), QueueConfig("c", 2 * nodes), QueueConfig("g"))
    config = FAIR_LAS
    snap = snapshot(cluster, waiting, run, list(queues), now=NOW)
    tree, free = tree_for(snap, config), FreeGpus.from_running(cluster, run)
    usage = QueueUsage.of(tree, run)
    idle = free.total_free
    cands = Candidates(sorted(run, key=lambda r: r.job.id), NOW, config)
    listed = cands.for_job(p, tree, usage, idle, snap.pending)
    # the shortcut: every running job left out of the list is no victim under the plain rule
    defragment = defragmenting(config, p.job, idle, snap.pending)
    for r in run:
        if r not in listed and statically_eligible(r, NOW, config):
            assert victim_kind(NOW, config, tree, usage.copy(), p, r, defragment=defragment) is None
    plan = plan_preemption(snap, p, config, free=free, tree=tree, usage=usage, candidates=listed, presorted=True,
                           eligible=True)
    assert free.total_free == idle  # left as it was
    if not isinstance(plan, PreemptionPlan):
        return
    moved = [v for v in plan.victims if v.job.queue != p.job.queue and defragments(config, p, v, NOW)
             and victim_kind(NOW, config, tree, usage.copy(), p, v) is None]
    if plan.reason.code is ReasonCode.PREEMPTED_TO_DEFRAGMENT:
        assert moved
    if not moved:
        return
    assert idle >= p.job.total_gpus and all(w.job.queue == p.job.queue for w in waiting)
    # independently: the victims gone, the preemptor placed, each moved job (largest first) fits
    gone = {v.job.id for v in plan.victims}
    holders = [r for r in run if r.job.id not in gone] + [RunningJob(p.job, plan.placement, NOW)]
    after = FreeGpus.from_running(cluster, holders)
    for v in sorted(moved, key=lambda v: (-v.placement.gpu_count, v.job.id)):
        spot = placement_or_none(after, v.job)
        assert spot is not None, f"{v.job.id} moved without room elsewhere"
        holders.append(RunningJob(v.job, spot, NOW))
        after = FreeGpus.from_running(cluster, holders)
