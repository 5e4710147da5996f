"""Job spec v2: image, runtimes, mounts, workdir, time limit, CPU/memory, checkpoint dir;
every problem names its field and the fix; JobSubmitted and NodeRegistered v1 stay readable."""

from __future__ import annotations

import msgspec
import pytest

from corral.contracts import SpecError, validate_job_spec
from corral.contracts.cluster import load_cluster_text
from corral.contracts.events import JobSubmitted, NodeRegistered
from corral.contracts.jobspec import parse_duration
from corral.contracts.registry import decode

BASE = {"name": "train", "queue": "q"}


def problems_of(obj: object) -> dict[str, tuple[str, str]]:
    with pytest.raises(SpecError) as info:
        validate_job_spec(obj)
    return {p.path: (p.message, p.hint) for p in info.value.problems}


def test_a_full_spec_reads_back_with_seconds_and_mounts() -> None:
    spec = validate_job_spec({
        **BASE, "runtime": "sandbox", "command": ["python", "train.py"], "workdir": "/work/run1",
        "mounts": [{"source": "imagenet", "target": "/data"}, {"source": "/scratch", "target": "/out",
                                                               "read_only": False}],
        "time_limit": "1h30m", "cpus_per_replica": 8, "memory_gib_per_replica": 64,
        "checkpoint": {"dir": "/shared/ckpt/run1"}})
    assert spec.time_limit == 5400.0
    assert [m.dataset for m in spec.mounts] == ["imagenet", None]
    assert spec.mounts[0].read_only and not spec.mounts[1].read_only
    assert spec.checkpoint.dir == "/shared/ckpt/run1"
    assert (spec.cpus_per_replica, spec.memory_gib_per_replica) == (8, 64)


@pytest.mark.parametrize(("text", "seconds"), [
    (3, 3.0), (2.5, 2.5), ("3s", 3.0), ("30m", 1800.0), ("2h", 7200.0), ("1d", 86400.0),
    ("1h30m", 5400.0), ("01:30:00", 5400.0), ("1-00:00:00", 86400.0), ("10:00", 36000.0)])
def test_time_limit_forms(text: object, seconds: float) -> None:
    assert validate_job_spec({**BASE, "command": ["x"], "time_limit": text}).time_limit == seconds
    if isinstance(text, str):
        assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["soon", "3 weeks", "", -1, 0, "0s"])
def test_a_bad_time_limit_names_the_field(bad: object) -> None:
    message, hint = problems_of({**BASE, "command": ["x"], "time_limit": bad})["time_limit"]
    assert message and ("2h" in hint or "30m" in hint)


@pytest.mark.parametrize("runtime", ["podman", "docker", "apptainer"])
def test_a_container_runtime_needs_an_image_but_no_command(runtime: str) -> None:
    message, hint = problems_of({**BASE, "runtime": runtime})["image"]
    assert f"runtime is `{runtime}`" in message and "image:" in hint
    assert validate_job_spec({**BASE, "runtime": runtime, "image": "pytorch:2.4"}).command is None


@pytest.mark.parametrize("runtime", ["process", "sandbox"])
def test_process_and_sandbox_need_a_command(runtime: str) -> None:
    message, hint = problems_of({**BASE, "runtime": runtime})["command"]
    assert f"runtime is `{runtime}`" in message and "command:" in hint


def test_an_image_without_a_container_runtime_is_refused() -> None:
    message, hint = problems_of({**BASE, "command": ["x"], "image": "pytorch:2.4"})["image"]
    assert "runs no image" in message and "runtime: podman" in hint


def test_mounts_need_a_runtime_that_can_mount() -> None:
    found = problems_of({**BASE, "command": ["x"], "mounts": [{"source": "/d", "target": "/d"}]})
    assert "runtime: sandbox" in found["mounts"][1]


@pytest.mark.parametrize(("mount", "path"), [
    ({"source": "relative/path", "target": "/d"}, "mounts[0].source"),
    ({"source": "/d", "target": "data"}, "mounts[0].target"),
    ({"source": "/d", "target": "/"}, "mounts[0].target"),
    ({"source": "/d", "target": "/a/../etc"}, "mounts[0].target"),
    ({"source": "/d"}, "mounts[0].target"),
    ({"source": "/d", "target": "/d", "rw": True}, "mounts[0].rw"),
])
def test_bad_mounts_name_the_field(mount: dict[str, object], path: str) -> None:
    found = problems_of({**BASE, "runtime": "sandbox", "command": ["x"], "mounts": [mount]})
    assert path in found, found


def test_workdir_and_checkpoint_dir_must_be_absolute() -> None:
    found = problems_of({**BASE, "command": ["x"], "workdir": "here", "checkpoint": {"dir": "ckpt"}})
    assert {"workdir", "checkpoint.dir"} <= set(found)


def test_cpus_and_memory_must_be_positive() -> None:
    found = problems_of({**BASE, "command": ["x"], "cpus_per_replica": 0, "memory_gib_per_replica": -1})
    assert {"cpus_per_replica", "memory_gib_per_replica"} <= set(found)


def test_cluster_file_declares_capacity_datasets_and_a_shared_checkpoint_dir() -> None:
    cluster = load_cluster_text("""
checkpoint_dir: /shared/ckpt
datasets: {imagenet: /shared/imagenet}
nodes:
  - {name: a, gpus: 8, model: H100, cpus: 96, host_memory_gib: 1024, datasets: {c4: /nvme/c4}}
  - {name: b, gpus: 8, model: H100, datasets: {imagenet: /nvme/imagenet}}
""")
    a, b = cluster.inventories()
    assert cluster.checkpoint_dir == "/shared/ckpt"
    assert (a.cpus, a.host_memory_gib) == (96, 1024)
    assert a.datasets == {"imagenet": "/shared/imagenet", "c4": "/nvme/c4"}
    assert b.datasets == {"imagenet": "/nvme/imagenet"}  # the node's own copy wins
    with pytest.raises(SpecError, match="datasets"):
        load_cluster_text("nodes: [{name: a, gpus: 1, model: H100, datasets: {x: relative}}]")


V1_ENVELOPE = {"event_id": "01HZZZZZZZZZZZZZZZZZZZZZZZ", "occurred_at": "2026-01-01T00:00:00Z",
               "correlation_id": "c", "actor": "cli", "schema_version": 1}


def test_a_v1_job_submitted_in_the_log_still_decodes_as_v2() -> None:
    raw = {**V1_ENVELOPE, "type": "JobSubmitted", "stream": "job-j1", "job_id": "j1",
           "spec": {"name": "old", "queue": "q", "command": ["python", "train.py"], "runtime": "process"}}
    event = decode(msgspec.json.encode(raw))
    assert isinstance(event, JobSubmitted) and event.schema_version == 2
    assert event.spec.image is None and event.spec.mounts == [] and event.spec.time_limit is None


def test_a_v1_node_registered_still_decodes_as_v2() -> None:
    raw = {**V1_ENVELOPE, "type": "NodeRegistered", "stream": "node-a", "node": "a",
           "gpus": [{"index": 0, "model": "H100", "memory_gib": 80}], "nvlink_domains": [[0]],
           "rack": "r", "zone": "z"}
    event = decode(msgspec.json.encode(raw))
    assert isinstance(event, NodeRegistered) and event.schema_version == 2
    assert event.datasets == {} and event.cpus is None
