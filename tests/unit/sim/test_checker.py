"""The independent checker catches every broken rule of a schedule and passes a valid one."""

from __future__ import annotations

from typing import Any

from corral.core import Cluster
from corral.sim.checker import check_schedule

CLUSTER = Cluster.uniform(2, 8, "H100", nodes_per_rack=1)


def _job(
    job_id: str,
    placements: list[dict[str, Any]],
    replicas: int = 1,
    per: int = 2,
    topology: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": job_id,
        "queue": "q",
        "gpus": replicas * per,
        "replicas": replicas,
        "gpus_per_replica": per,
        "topology": topology or {},
        "submit": 0.0,
        "start": placements[0]["start"] if placements else None,
        "end": placements[-1]["end"] if placements else None,
        "placements": placements,
    }


def _at(start: float, end: float, *ranks: tuple[str, list[int]]) -> dict[str, Any]:
    return {"start": start, "end": end, "ranks": [{"node": n, "gpus": g} for n, g in ranks]}


def test_valid_schedule_has_no_violations() -> None:
    jobs = [
        _job("a", [_at(0, 10, ("n000", [0, 1]))]),
        _job("b", [_at(10, 20, ("n000", [0, 1]))]),  # reuses a's GPUs exactly when a ends
        _job("c", [_at(0, 5, ("n000", [2, 3]), ("n001", [0, 1]))], replicas=2, topology={"gang": "zone"}),
    ]
    assert check_schedule(jobs, CLUSTER) == []


def test_gpu_in_two_jobs_at_once_is_caught() -> None:
    jobs = [_job("a", [_at(0, 10, ("n000", [0, 1]))]), _job("b", [_at(5, 15, ("n000", [1, 2]))])]
    assert [v.code for v in check_schedule(jobs, CLUSTER)] == ["GPU_DOUBLE_BOOKED"]


def test_missing_rank_and_wrong_gpu_count_are_caught() -> None:
    jobs = [_job("a", [_at(0, 10, ("n000", [0, 1, 2]))], replicas=2)]
    codes = {v.code for v in check_schedule(jobs, CLUSTER)}
    assert {"MISSING_RANKS", "RANK_GPUS"} <= codes


def test_hard_gang_topology_is_checked() -> None:
    jobs = [_job("a", [_at(0, 10, ("n000", [0, 1]), ("n001", [0, 1]))], replicas=2, topology={"gang": "rack"})]
    assert [v.code for v in check_schedule(jobs, CLUSTER)] == ["TOPOLOGY"]


def test_gpu_that_does_not_exist_is_caught() -> None:
    jobs = [_job("a", [_at(0, 10, ("n000", [7, 8]))])]
    assert [v.code for v in check_schedule(jobs, CLUSTER)] == ["NO_SUCH_GPU"]


def test_start_before_submit_is_caught() -> None:
    job = _job("a", [_at(0, 10, ("n000", [0, 1]))])
    job["submit"] = 3.0
    assert [v.code for v in check_schedule([job], CLUSTER)] == ["TIME_ORDER"]
