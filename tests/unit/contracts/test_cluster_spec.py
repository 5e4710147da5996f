"""Cluster files and the `4x8:H100` shorthand describe nodes, NVLink domains, racks and zones."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.contracts import SpecError, load_cluster_file, parse_cluster_shorthand, validate_cluster_spec


def test_shorthand_gives_nodes_of_one_nvlink_domain_each() -> None:
    cluster = parse_cluster_shorthand("4x8:H100")
    assert [n.name for n in cluster.nodes] == ["node-0", "node-1", "node-2", "node-3"]
    assert cluster.total_gpus == 32
    for inventory in cluster.inventories():
        assert inventory.nvlink_domains == [list(range(8))]
        assert {g.model for g in inventory.gpus} == {"H100"}
        assert {g.memory_gib for g in inventory.gpus} == {80.0}


def test_shorthand_puts_eight_nodes_per_rack() -> None:
    cluster = parse_cluster_shorthand("17x8:H100")
    racks = [n.rack for n in cluster.nodes]
    assert racks[:8] == ["rack-0"] * 8 and racks[8:16] == ["rack-1"] * 8 and racks[16] == "rack-2"


def test_shorthand_memory_suffix_sets_memory_per_gpu() -> None:
    inventory = parse_cluster_shorthand("2x4:A100:40").inventories()[0]
    assert {g.memory_gib for g in inventory.gpus} == {40.0}
    assert {g.model for g in inventory.gpus} == {"A100"}


def test_shorthand_groups_continue_names_and_racks() -> None:
    cluster = parse_cluster_shorthand("2x8:H100,1x4:L40S")
    assert [n.name for n in cluster.nodes] == ["node-0", "node-1", "node-2"]
    assert cluster.nodes[2].inventory().gpus[0].memory_gib == 48.0


@pytest.mark.parametrize("text", ["4x", "x8:H100", "4*8:H100", "0x8:H100", "4x8:H100:fast", "", "4x99999"])
def test_bad_shorthand_is_a_spec_error_with_the_format(text: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_cluster_shorthand(text)
    assert "NODESxGPUS" in info.value.problems[0].hint


CLUSTER_YAML = """
nodes:
  - name: dgx-0
    gpus: 8
    model: H100
    rack: r1
    zone: z1
  - name: pcie-0
    gpus: 8
    model: A100
    memory_gib: 40
    nvlink_domains: [[0, 1], [2, 3], [4, 5], [6, 7]]
    rack: r2
  - name: mixed-0
    model: L4
    gpus:
      - {index: 0}
      - {index: 1, model: T4}
"""


def test_cluster_file_loads_with_domains_racks_and_zones(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER_YAML)
    cluster = load_cluster_file(path)
    dgx, pcie, mixed = cluster.inventories()
    assert (dgx.rack, dgx.zone, dgx.nvlink_domains) == ("r1", "z1", [list(range(8))])
    assert pcie.nvlink_domains == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert pcie.zone == "zone-0"
    assert [(g.model, g.memory_gib) for g in mixed.gpus] == [("L4", 24.0), ("T4", 16.0)]


def test_gpus_left_out_of_listed_domains_are_alone() -> None:
    cluster = validate_cluster_spec({"nodes": [{"name": "n", "gpus": 4, "model": "H100",
                                                "nvlink_domains": [[0, 1]]}]})
    assert cluster.inventories()[0].nvlink_domains == [[0, 1], [2], [3]]


def test_bad_nvlink_domains_name_the_domain_and_the_gpu() -> None:
    with pytest.raises(SpecError) as info:
        validate_cluster_spec({"nodes": [{"name": "n", "gpus": 4, "model": "H100",
                                          "nvlink_domains": [[0, 1], [1, 9]]}]})
    found = {(p.path, p.message) for p in info.value.problems}
    assert ("nodes[0].nvlink_domains[1]", "GPU 1 is in two NVLink domains") in found
    assert ("nodes[0].nvlink_domains[1]", "GPU 9 is not on this node") in found


def test_duplicate_node_names_are_rejected() -> None:
    with pytest.raises(SpecError) as info:
        validate_cluster_spec([{"name": "n", "gpus": 1, "model": "H100"},
                               {"name": "n", "gpus": 1, "model": "H100"}])
    assert info.value.problems[0].path == "nodes[1].name"


def test_cluster_file_problems_name_node_and_field_with_hints() -> None:
    with pytest.raises(SpecError) as info:
        validate_cluster_spec({"nodes": [{"name": "n", "gpus": 2.5, "model": "H100", "rak": "r"}]})
    found = {p.path: p.hint for p in info.value.problems}
    assert found["nodes[0].rak"] == "did you mean `rack`?"
    assert "GPU count" in found["nodes[0].gpus"]


def test_cluster_needs_at_least_one_node() -> None:
    with pytest.raises(SpecError) as info:
        validate_cluster_spec({"nodes": []})
    assert info.value.problems[0].path == "nodes"
