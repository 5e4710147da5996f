"""`sim_main` (behind `corral sim`) reads a JSONL workload, prints the table, writes JSON and plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.cli.sim import sim_main


def _workload(tmp_path: Path) -> Path:
    lines = [
        {
            "name": f"j{i}",
            "queue": "team-a" if i % 2 else "team-b",
            "submit_at": i * 10,
            "duration_seconds": 100,
            "replicas": 1 + (i % 3 == 0),
            "gpus_per_replica": 4,
        }
        for i in range(12)
    ]
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_sim_writes_the_table_json_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run.json"
    plots = tmp_path / "plots"
    code = sim_main(
        ["--trace", str(_workload(tmp_path)), "--cluster", "2x8:H100", "--json", str(out), "--plot", str(plots)]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "avg JCT" in printed and "team-a" in printed
    document = json.loads(out.read_text())
    assert document["summary"]["jobs"] == 12 and len(document["jobs"]) == 12
    assert {p.name for p in plots.iterdir()} == {"utilisation.png", "jct_cdf.png", "queue_share_corral.png"}


def test_compare_prints_policies_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = sim_main(["--trace", str(_workload(tmp_path)), "--cluster", "2x8:H100"], compare_all=True)
    assert code == 0
    header = capsys.readouterr().out.splitlines()[1]
    assert all(p in header for p in ("corral", "fifo", "priority", "backfill", "las"))


def test_bad_cluster_shorthand_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_main(["--trace", str(_workload(tmp_path)), "--cluster", "lots"]) == 2
    assert "NODESxGPUS" in capsys.readouterr().err


def test_cluster_and_queues_files_are_read_like_corral_up(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "nodes:\n"
        "  - {name: a0, gpus: 8, model: H100, rack: r0}\n"
        "  - {name: a1, gpus: 8, model: H100, rack: r0, nvlink_domains: [[0, 1, 2, 3], [4, 5, 6, 7]]}\n"
    )
    queues = tmp_path / "queues.yaml"
    queues.write_text("queues:\n  - {name: team-a, guaranteed_gpus: 12}\n  - {name: team-b, guaranteed_gpus: 4}\n")
    out = tmp_path / "run.json"
    code = sim_main(
        ["--trace", str(_workload(tmp_path)), "--cluster", str(cluster), "--queues", str(queues), "--json", str(out)]
    )
    assert code == 0
    document = json.loads(out.read_text())
    assert document["cluster"]["gpus"] == 16
    assert {q["name"]: q["guaranteed_gpus"] for q in document["queues"]} == {"team-a": 12, "team-b": 4}
    assert {r["node"] for j in document["jobs"] for p in j["placements"] for r in p["ranks"]} <= {"a0", "a1"}
