"""GangReserved + JobSpec -> this node's Assignment, and the CLI's reading of cluster files."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.contracts.envelope import job_stream
from corral.contracts.events import GangReserved, RankPlacement
from corral.contracts.jobspec import JobSpec
from corral.services.node_agent.__main__ import UsageError, model_name, read_cluster
from corral.services.node_agent.reservation import build_assignment, job_command, local_ranks


def gang(placement: list[tuple[int, str, list[int]]], **extra: object) -> GangReserved:
    return GangReserved.new(stream=job_stream("j"), actor="placement", job_id="j",
                            ranks=[RankPlacement(rank=r, node=n, gpus=g) for r, n, g in placement],
                            world_size=len(placement), master_addr="10.0.0.1", master_port=29500, **extra)


def test_node_rank_follows_the_node_of_the_lowest_rank_and_local_ranks_follow_rank_order() -> None:
    event = gang([(3, "a", [1]), (0, "b", [5]), (1, "a", [0]), (2, "b", [4])])
    b, a = local_ranks(event, "b"), local_ranks(event, "a")
    assert b is not None and a is not None
    assert b.node_rank == 0 and [(r.rank, r.local_rank, r.gpus) for r in b.ranks] == [(0, 0, (5,)), (2, 1, (4,))]
    assert a.node_rank == 1 and [(r.rank, r.local_rank, r.gpus) for r in a.ranks] == [(1, 0, (0,)), (3, 1, (1,))]
    assert local_ranks(event, "c") is None


def test_assignment_counts_attempts_as_events_do_and_never_restarts_locally(tmp_path: Path) -> None:
    spec = JobSpec(name="j", queue="q", runtime="process", command=["train"], env={"A": "1"})
    a = build_assignment(gang([(0, "a", [0])], attempt=2, resume_from="/c/s.pt"), "a", spec, runtime="process",
                         python="py", checkpoint_root=tmp_path, log_dir=tmp_path / "logs")
    assert a is not None
    assert (a.attempt, a.max_restarts, a.command, a.resume_from) == (2, 0, ("train",), Path("/c/s.pt"))
    assert a.checkpoint_dir == tmp_path / "j" and a.env == {"A": "1"}


def test_sim_runtime_simulates_process_jobs_and_passes_sim_args() -> None:
    process = JobSpec(name="j", queue="q", command=["train"], estimated_runtime_seconds=7)
    assert job_command(process, "process", "py") == ("train",)
    assert job_command(process, "sim", "py")[:5] == ("py", "-m", "corral.worker", "sim", "--duration")
    sim = JobSpec(name="j", queue="q", runtime="sim", duration_seconds=3.0, env={"CORRAL_SIM_ARGS": "--fail-at-step 2"})
    command = job_command(sim, "process", "py")
    assert command[5] == "3.0" and command[-2:] == ("--fail-at-step", "2")


def test_cluster_file_may_hold_a_shorthand_or_yaml(tmp_path: Path) -> None:
    short = tmp_path / "cluster.shorthand"
    short.write_text("3x2:A100\n")
    assert [n.name for n in read_cluster(short).nodes] == ["node-0", "node-1", "node-2"]
    yaml_file = tmp_path / "cluster.yaml"
    yaml_file.write_text("nodes:\n  - {name: big, gpus: 8, model: H100, nvlink_domains: [[0,1,2,3]]}\n")
    assert read_cluster(yaml_file).inventories()[0].nvlink_domains == [[0, 1, 2, 3], [4], [5], [6], [7]]
    bad = tmp_path / "bad.shorthand"
    bad.write_text("4y8:H100\n")
    with pytest.raises(UsageError, match="cannot read cluster shorthand"):
        read_cluster(bad)


def test_nvml_names_become_contract_model_names() -> None:
    assert model_name("NVIDIA H100 80GB HBM3") == "H100"
    assert model_name("NVIDIA A100-SXM4-80GB") == "A100"
    assert model_name("NVIDIA GeForce RTX 4090") == "GeForce-RTX-4090"
