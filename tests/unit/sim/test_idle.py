"""Where a schedule leaves GPUs idle and how long each gang class waits (`corral.sim.idle`),
worked out by hand on small schedules."""

from __future__ import annotations

from corral.core import Cluster, QueueConfig
from corral.sim.idle import gang_class, gang_waits, idle_breakdown, utilisation_bound
from corral.sim.records import Interval, JobRecord, RankRecord


def _rec(id: str, gpus: int, submit: float, spans: list[tuple[float, float, str, tuple[int, ...]]],
         replicas: int = 1, queue: str = "q") -> JobRecord:
    placements = [Interval(s, e, (RankRecord(node, g),)) for s, e, node, g in spans]
    return JobRecord(id, queue, gpus, replicas, gpus // replicas, 0, submit, 0.0, {}, placements[0].start if placements
                     else None, placements[-1].end if placements else None, placements=placements)


def test_scattered_idle_gpus_are_fragmentation_then_nothing_waits() -> None:
    """2x4: a and b hold 3 GPUs of each node 0-100; c (2 GPUs on one node) waits 0-100 on 1+1 idle
    GPUs (fragmentation: 2 x 100), then runs 100-150 while 6 idle GPUs wait for nobody (6 x 50)."""
    cluster = Cluster.uniform(2, 4, "H100")
    n0, n1 = (n.name for n in cluster.nodes)
    records = [_rec("a", 3, 0, [(0, 100, n0, (0, 1, 2))]), _rec("b", 3, 0, [(0, 100, n1, (0, 1, 2))]),
               _rec("c", 2, 0, [(100, 150, n0, (0, 1))])]
    idle = idle_breakdown(records, cluster, [QueueConfig("q")])
    assert idle.seconds == {"nothing_waiting": 300, "held": 0, "quota_ceilings": 0, "fragmentation": 200,
                            "gangs_larger_than_idle": 0}
    assert idle.capacity_gpu_seconds == 8 * 150
    assert gang_waits(records) == {2: (1, 100.0), 4: (2, 0.0)}


def test_idle_gpus_a_waiting_job_fits_on_are_held_or_at_a_ceiling_and_a_big_gang_drains() -> None:
    """1x4, queue r capped at 2 GPUs: d (r, 2 GPUs) runs 0-50 while e (r, 2 GPUs) would fit on the 2
    idle GPUs but r is at its ceiling (quota ceilings: 2 x 50); e runs 50-100 while the 4-GPU gang g
    waits on 2 idle GPUs (gangs larger than idle: 2 x 50); g runs 100-110. Then h (1 GPU, queue q)
    arrives at 110 and waits to 120 on an idle node it fits on (held: 4 x 10)."""
    cluster = Cluster.uniform(1, 4, "H100")
    n0 = cluster.nodes[0].name
    records = [_rec("d", 2, 0, [(0, 50, n0, (0, 1))], queue="r"), _rec("e", 2, 0, [(50, 100, n0, (0, 1))], queue="r"),
               _rec("g", 4, 0, [(100, 110, n0, (0, 1, 2, 3))]), _rec("h", 1, 110, [(120, 130, n0, (0,))])]
    idle = idle_breakdown(records, cluster, [QueueConfig("q"), QueueConfig("r", max_gpus=2)])
    assert idle.seconds == {"nothing_waiting": 30, "held": 40, "quota_ceilings": 100, "fragmentation": 0,
                            "gangs_larger_than_idle": 100}
    assert [gang_class(g) for g in (1, 2, 3, 4, 5, 8, 12, 16)] == [1, 2, 4, 4, 8, 8, 16, 16]


def _job(gpus: int, submit: float, duration: float) -> JobRecord:
    return JobRecord(f"j{submit}-{gpus}", "q", gpus, 1, gpus, 0, submit, duration, {})


def test_the_utilisation_bound_is_the_work_over_the_shortest_makespan_possible() -> None:
    """4 GPUs. a (4 GPUs x 100 s) and b (4 x 100) at 0 drain no sooner than 200: 800 / (4 x 200) = 1.
    c (1 GPU x 300 s) at 0 ends no sooner than 300: 1,100 / (4 x 300). With d (4 x 50) at 250,
    the fluid drain from 250 ends at 300 too, and from 0 at (1,100 + 200) / 4 = 325."""
    assert utilisation_bound([_job(4, 0, 100), _job(4, 0, 100)], 4) == 1.0
    assert utilisation_bound([_job(4, 0, 100), _job(4, 0, 100), _job(1, 0, 300)], 4) == 1100 / 1200
    assert utilisation_bound([_job(4, 0, 100), _job(4, 0, 100), _job(1, 0, 300), _job(4, 250, 50)], 4) == 1300 / 1300
    assert utilisation_bound([], 4) == 0.0
