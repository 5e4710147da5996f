"""bench/e2e.py says when a phase measured the cluster's size rather than the scheduler.

Why: a cluster turns over only so many jobs a second (512 GPUs, each held ~1.08 s by jobs of 2.6
GPUs, take ~182 jobs a second), so placements below the offered rate on a cluster that small
measure the cluster, not the scheduler; the report says so and names a cluster that holds the rate.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from e2e import capacity_ceiling, nodes_for, render


def test_the_default_cluster_takes_about_182_jobs_a_second() -> None:
    assert capacity_ceiling(512, 2.6, 1.08) == pytest.approx(182.3, abs=0.1)
    assert capacity_ceiling(512, 2.6, None) is None


def test_the_cluster_suggested_holds_the_rate_with_room() -> None:
    nodes = nodes_for(300, 2.6, 1.08)
    ceiling = capacity_ceiling(nodes * 8, 2.6, 1.08)
    assert ceiling is not None and 300 * 1.2 < ceiling < 300 * 1.3


def _phase(rate: float, hold: float, placed_per_s: float, p99: float) -> dict[str, object]:
    return {"rate": rate, "jobs": int(rate * 10), "placed": int(rate * 10), "mean_gpus": 2.6, "gpu_hold_s": hold,
            "placements": {"steady_per_s": placed_per_s, "best_second": placed_per_s},
            "submit_to_admitted_ms": {"p50": 9}, "submit_to_quota_ms": {"p50": 40},
            "submit_to_placed_ms": {"p50": 70, "p99": p99}, "submit_to_running_ms": {"p50": 100, "p99": 150},
            "cpu_seconds": {"placement": 1.0}, "cpu_ms_per_job": 6.0}


def _render(nodes: int, runtime: str, *phases: dict[str, object]) -> str:
    """The bench's report of `phases` run on `nodes` x 8 H100s with `runtime`."""
    return render({"cluster": f"{nodes}x8:H100", "gpus": nodes * 8, "runtime": runtime, "duration": 1.0,
                   "command": "c", "date": "d", "phases": list(phases)})


def test_a_phase_above_the_ceiling_is_named_with_the_cluster_that_holds_it() -> None:
    text = _render(64, "sim-timer", _phase(100, 1.03, 99.9, 107), _phase(300, 1.08, 177.8, 6828))
    assert "300/s is above what 512 GPUs hold" in text
    assert f"--cluster {nodes_for(300, 2.6, 1.08)}x8:H100 holds it" in text
    assert "100/s is above" not in text
    assert "target: p99 submit->placed < 250 ms at 100 jobs/s -> MET (p99 107 ms)" in text
    assert ">= 300 placements/s sustained (stretch 500) -> MISSED (best steady 177.8/s)" in text


def test_without_a_cluster_the_bench_sizes_one_that_holds_the_highest_rate() -> None:
    from e2e import default_cluster

    assert default_cluster([100.0], 1.0) == "64x8:H100"  # a low rate: the default cluster
    for rates in ([100.0, 300.0], [500.0]):
        nodes = int(default_cluster(rates, 1.0).split("x")[0])
        ceiling = capacity_ceiling(nodes * 8, 2.6, 1.1)
        assert ceiling is not None and ceiling > 1.2 * max(rates)


def test_a_phase_that_kept_up_says_to_offer_more() -> None:
    """Placements cannot exceed the rate offered: 296.8/s at 300/s offered is a stack keeping up."""
    text = _render(135, "sim-timer", _phase(300, 1.08, 296.8, 255))
    assert "offer more than the target to measure past it" in text
    text = _render(192, "sim-timer", _phase(400, 1.22, 385.5, 572))
    assert "-> MET (best steady 385.5/s)" in text


def test_each_runtime_is_judged_by_its_own_sustained_target() -> None:
    """600 placements/s with timers in the agent; 100 with a real process per rank."""
    timers = _render(269, "sim-timer", _phase(600, 1.1, 512.0, 300))
    assert "target: >= 600 placements/s sustained with the sim-timer runtime -> MISSED (best steady 512.0/s)" in timers
    processes = _render(64, "process", _phase(100, 1.1, 99.5, 300))
    assert "target: >= 100 placements/s sustained with the process runtime -> MET (best steady 99.5/s)" in processes
