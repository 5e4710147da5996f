"""Every example job spec and cluster file in examples/ is valid, and `corral submit` runs a process
job in the submitter's folder (so examples/ddp-allreduce.yaml does not depend on the agent's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.cli.jobs import in_folder
from corral.contracts.cluster import load_cluster_file
from corral.contracts.jobspec import load_job_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOT_JOBS = {"queues.yaml", "bad-spec.yaml", "cluster-datasets.yaml"}


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.yaml") if p.name not in NOT_JOBS))
def test_every_example_job_spec_is_valid(name: str) -> None:
    load_job_spec((EXAMPLES / name).read_text())


def test_the_runtime_examples_say_what_they_show() -> None:
    container = load_job_spec((EXAMPLES / "ddp-container.yaml").read_text())
    assert container.runtime == "podman" and container.image and container.time_limit == 1800
    mounted = load_job_spec((EXAMPLES / "dataset-mount.yaml").read_text())
    assert mounted.runtime == "sandbox" and mounted.mounts[0].dataset == "imagenet"
    cluster = load_cluster_file(EXAMPLES / "cluster-datasets.yaml")
    assert "imagenet" in cluster.inventories()[0].datasets and cluster.checkpoint_dir


def test_submit_fills_a_process_jobs_workdir_with_the_submitters_folder() -> None:
    assert in_folder({"name": "a", "command": ["x"]}, "/home/me/proj")["workdir"] == "/home/me/proj"
    assert in_folder({"workdir": "sub/dir"}, "/home/me")["workdir"] == "/home/me/sub/dir"
    assert in_folder({"workdir": "/abs"}, "/home/me")["workdir"] == "/abs"
    assert "workdir" not in in_folder({"runtime": "podman", "image": "x"}, "/home/me")
    assert in_folder(["not", "a", "mapping"], "/x") == ["not", "a", "mapping"]
