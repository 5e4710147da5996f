"""One spec-to-core translation: the services and the simulator build the same `core.Job`.

The bug this pins: `translate.job_from_spec` truncated `checkpoint.grace_seconds` (30.5 s became
30 s: less time to checkpoint than the job asked for) while the simulator rounded it up, so a
replay did not decide what the live cluster would.
"""

from __future__ import annotations

import pytest

from corral import core
from corral.contracts.jobspec import JobSpec, validate_job_spec
from corral.sim.engine import core_job
from corral.sim.importers.jsonl import job_from_spec as sim_job_from_spec
from corral.translate import job_from_spec, whole_seconds_at_least


@pytest.mark.parametrize(("seconds", "expected"), [
    (0.0, 0),
    (30.0, 30),
    (30.5, 31),  # a deadline: rounding down would give the job half a second less than it asked
    (30.001, 31),
    (0.2, 1),
])
def test_promised_durations_round_up_to_whole_seconds(seconds: float, expected: int) -> None:
    assert whole_seconds_at_least(seconds) == expected
    assert whole_seconds_at_least(seconds) >= seconds


def spec(**fields: object) -> JobSpec:
    return validate_job_spec({"name": "j", "queue": "team-a", "runtime": "sim", "duration_seconds": 60,
                              "replicas": 2, "gpus_per_replica": 4, **fields})


@pytest.mark.parametrize("fields", [
    {},
    {"checkpoint": {"grace_seconds": 30.5}, "min_runtime_seconds": 0.25},
    {"gpu": {"model": "H100", "min_memory_gib": 79.0005}},
    {"gpu": {"min_memory_gib": 40}},
    {"gpu": {}},  # names no model and no memory: any GPU, as no request at all
    {"topology": {"gang": "rack", "prefer": "node"}, "priority": "high", "preemptible": False},
    {"estimated_runtime_seconds": 120.5},
])
def test_the_services_and_the_simulator_build_the_same_core_job(fields: dict[str, object]) -> None:
    s = spec(**fields)
    live = job_from_spec("j", s, 100.0)
    replayed = core_job(sim_job_from_spec(s, 100.0, 1800.0))
    assert live == replayed


def test_a_fractional_grace_and_min_runtime_are_rounded_up_and_memory_too() -> None:
    job = job_from_spec("j", spec(checkpoint={"grace_seconds": 30.5}, min_runtime_seconds=59.1,
                                  gpu={"min_memory_gib": 79.0005}), 0.0)
    assert job.checkpoint_grace_seconds == 31
    assert job.min_runtime_seconds == 60
    assert job.gpu == core.GpuRequest(model=None, min_memory_gib=80)  # int(x + 0.999) said 79
