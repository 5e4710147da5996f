"""Importers map each source onto Corral's model exactly as the traces README says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.sim.importers import load_workload
from corral.sim.workload import WorkloadError


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_philly_big_jobs_become_gangs_of_whole_nodes(tmp_path: Path) -> None:
    csv = _write(
        tmp_path / "philly.csv",
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-09-04 10:00:00,100.0,4,400.0,vc1\n"
        "2017-09-04 10:00:30,50.0,32,1600.0,vc2\n"
        "2017-09-04 10:01:00,10.0,12,120.0,vc1\n",
    )
    workload = load_workload(f"philly:{csv}")
    small, big, odd = workload.jobs
    assert (small.submit, small.replicas, small.gpus_per_replica, small.queue) == (0.0, 1, 4, "vc1")
    assert (big.submit, big.replicas, big.gpus_per_replica, big.queue) == (30.0, 4, 8, "vc2")
    assert (odd.replicas, odd.gpus_per_replica) == (2, 6)
    assert all(j.topology.replica == "node" and j.priority == 0 for j in workload.jobs)
    assert workload.queues == ("vc1", "vc2")


def test_openb_maps_sharing_qos_and_running_tasks(tmp_path: Path) -> None:
    csv = _write(
        tmp_path / "openb.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
        "scheduled_time\n"
        "p0,1000,1024,1,460,,BE,Running,100,900,110\n"
        "p1,1000,1024,2,1000,V100M16,LS,Succeeded,105,300,200\n"
        "p2,1000,1024,0,0,,LS,Running,120,900,120\n"
        "p3,1000,1024,1,1000,,BE,Pending,130,140,\n",
    )
    workload = load_workload(f"openb:{csv}")
    assert [j.id for j in workload.jobs] == ["p0", "p1"]
    be, ls = workload.jobs
    assert (be.submit, be.duration, be.gpus, be.preemptible) == (0.0, 790.0, 1, True)
    assert (ls.submit, ls.duration, ls.gpus, ls.gpu_model, ls.preemptible) == (
        5.0,
        100.0,
        2,
        "V100M16",
        False,
    )
    assert ls.priority > be.priority
    assert any("counts as one whole GPU" in n for n in workload.notes)
    assert any("1 CPU-only tasks and 1 tasks never scheduled" in n for n in workload.notes)


def test_jsonl_reads_job_specs_with_submit_and_duration(tmp_path: Path) -> None:
    lines = [
        {
            "name": "a",
            "queue": "research/nlp",
            "submit_at": 10,
            "duration_seconds": 60,
            "replicas": 2,
            "gpus_per_replica": 4,
            "priority": "high",
            "topology": {"gang": "rack"},
            "checkpoint": {"grace_seconds": 5},
            "checkpoint_interval_seconds": 600,
        },
        {"name": "b", "queue": "ops", "submit_at": 5, "duration_seconds": 30},
    ]
    path = _write(tmp_path / "w.jsonl", "# a comment\n" + "\n".join(json.dumps(x) for x in lines) + "\n\n")
    workload = load_workload(path)
    b, a = workload.jobs
    assert (b.id, b.submit, a.submit) == ("b", 0.0, 5.0)
    assert (a.gpus, a.priority, a.topology.gang, a.checkpoint_grace_seconds) == (8, 900, "rack", 5.0)
    assert a.checkpoint_interval_seconds == 600.0


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ({"name": "a", "queue": "q", "duration_seconds": 1}, "submit_at"),
        ({"name": "a", "queue": "q", "submit_at": 0}, "duration_seconds"),
        ({"name": "a", "queue": "q", "submit_at": 0, "duration_seconds": 1, "replicas": 0}, "replicas"),
        (
            {"name": "a", "queue": "q", "submit_at": 0, "duration_seconds": 1, "topology": {"gang": "row"}},
            "topology.gang",
        ),
    ],
)
def test_jsonl_error_names_line_and_field(tmp_path: Path, line: dict[str, object], field: str) -> None:
    path = _write(tmp_path / "bad.jsonl", json.dumps(line) + "\n")
    with pytest.raises(WorkloadError) as error:
        load_workload(path)
    assert "line 1" in str(error.value) and field in str(error.value)


def test_unknown_importer_names_the_choices() -> None:
    with pytest.raises(WorkloadError, match="philly"):
        load_workload("alibaba:/nonexistent.csv")
