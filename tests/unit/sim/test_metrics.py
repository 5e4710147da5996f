"""Summary figures follow their stated definitions."""

from __future__ import annotations

import pytest

from corral.core import Cluster, QueueConfig
from corral.sim.metrics import fair_shares, percentile, summarize
from corral.sim.records import Interval, JobRecord, RankRecord

CLUSTER = Cluster.uniform(2, 8, "H100")


def _record(
    job_id: str, queue: str, gpus: int, submit: float, start: float, end: float, ranks: tuple[RankRecord, ...]
) -> JobRecord:
    return JobRecord(
        id=job_id,
        queue=queue,
        gpus=gpus,
        replicas=len(ranks),
        gpus_per_replica=gpus // len(ranks),
        priority=0,
        submit=submit,
        duration=end - start,
        topology={},
        start=start,
        end=end,
        placements=[Interval(start, end, ranks)],
    )


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50.0, 99.0, 100.0)
    assert percentile([], 50) == 0.0


def test_fair_shares_fill_guarantee_then_surplus_by_weight_capped_by_demand() -> None:
    assert fair_shares(16, [16, 16], [8, 8], [1, 1]) == [8, 8]
    assert fair_shares(16, [2, 16], [8, 8], [1, 1]) == [2, 14]
    assert fair_shares(16, [16, 16, 16], [0, 0, 0], [2, 1, 1]) == [8, 4, 4]


def test_summary_of_a_hand_made_schedule() -> None:
    records = [
        _record("a", "x", 8, 0, 0, 100, (RankRecord("n000", tuple(range(8))),)),
        _record(
            "b",
            "y",
            16,
            0,
            100,
            200,
            (RankRecord("n000", tuple(range(8))), RankRecord("n001", tuple(range(8)))),
        ),
        _record("c", "y", 2, 0, 0, 50, (RankRecord("n001", (0,)), RankRecord("n000", (0,)))),
    ]
    queues = (QueueConfig("x", guaranteed_gpus=8), QueueConfig("y", guaranteed_gpus=8))
    s = summarize(records, CLUSTER, queues)
    assert (s.jobs, s.finished, s.makespan) == (3, 3, 200.0)
    assert s.avg_jct == pytest.approx((100 + 200 + 50) / 3)
    assert s.avg_wait == pytest.approx(100 / 3)
    assert s.gpu_utilisation == pytest.approx((800 + 1600 + 100) / (16 * 200))
    # b spans two nodes but 16 GPUs cannot fit one node: tight; c's 2 GPUs could share one node: not.
    assert (s.multi_gpu_jobs, s.tight_placement_share) == (3, pytest.approx(2 / 3))
    assert 0 < s.jain_fairness <= 1
