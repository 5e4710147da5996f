from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from corral.services.node_agent.host.inventory import (
    NodeInventory,
    NvmlUnavailable,
    declared_inventory,
    discover,
    load_declared_inventories,
    nvlink_domains,
)


def test_declared_inventory_carries_model_memory_domains_and_place() -> None:
    inv = declared_inventory({"node": "n1", "model": "H100", "memory_gib": 80, "gpus": 8,
                              "nvlink_domains": [[4, 5, 6, 7], [0, 1, 2, 3]], "rack": "r1", "zone": "z1"})
    assert inv.gpu_count == 8
    assert inv.model == "H100"
    assert {g.memory_gib for g in inv.gpus} == {80.0}
    assert inv.nvlink_domains == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert (inv.rack, inv.zone, inv.source) == ("r1", "z1", "declared")


def test_gpus_left_out_of_nvlink_domains_stand_alone() -> None:
    inv = declared_inventory({"node": "n1", "model": "A100", "memory_gib": 40, "gpus": 4,
                              "nvlink_domains": [[0, 1]]})
    assert inv.nvlink_domains == ((0, 1), (2,), (3,))
    no_links = declared_inventory({"node": "n2", "model": "L4", "memory_gib": 24, "gpus": 2})
    assert no_links.nvlink_domains == ((0,), (1,))


@pytest.mark.parametrize(("change", "field"), [
    ({"gpus": -1}, "gpus"),
    ({"memory_gib": 0}, "memory_gib"),
    ({"nvlink_domains": [[0, 9]]}, "nvlink_domains"),
    ({"nvlink_domains": [[0, 1], [1, 2]]}, "nvlink_domains"),
    ({"colour": "red"}, "colour"),
    ({"node": ""}, "node"),
])
def test_a_bad_declaration_names_the_field(change: dict[str, Any], field: str) -> None:
    spec = {"node": "n1", "model": "H100", "memory_gib": 80, "gpus": 4, **change}
    with pytest.raises(ValueError, match=field):
        declared_inventory(spec)


def test_a_missing_required_field_is_named() -> None:
    with pytest.raises(ValueError, match="'model' is required"):
        declared_inventory({"node": "n1", "memory_gib": 80, "gpus": 4})


def test_yaml_with_a_nodes_list_declares_every_node(tmp_path: Path) -> None:
    path = tmp_path / "nodes.yaml"
    path.write_text(
        "nodes:\n"
        "  - {node: a, model: H100, memory_gib: 80, gpus: 8, nvlink_domains: [[0,1,2,3,4,5,6,7]], rack: r1}\n"
        "  - {node: b, model: H100, memory_gib: 80, gpus: 8, nvlink_domains: [[0,1],[2,3],[4,5],[6,7]]}\n")
    a, b = load_declared_inventories(path)
    assert a.nvlink_domains == ((0, 1, 2, 3, 4, 5, 6, 7),)
    assert len(b.nvlink_domains) == 4


def test_machine_without_nvml_gets_a_clear_value_not_an_exception() -> None:
    # This machine has no GPU driver: the real pynvml fails to initialise.
    result = discover("n1")
    assert isinstance(result, NvmlUnavailable)
    assert "fake inventory" in result.message


class _FakeNvml:
    """Just enough of the pynvml API: 4 GPUs, NVLink 0<->1 and 2<->3, link slots beyond 2 absent."""

    class NVMLError(Exception):
        pass

    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 4

    def __init__(self, links: dict[int, list[int]], fail_init: bool = False) -> None:
        self.links = links
        self.fail_init = fail_init
        self.shut_down = False

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return 4

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h}"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(total=80 * 1024**3)

    def nvmlDeviceGetPciInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(busId=f"00000000:0{h}:00.0")

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        peers = self.links.get(h, [])
        if link >= 2:
            raise self.NVMLError("Not Supported")
        return 1 if link < len(peers) else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> SimpleNamespace:
        return SimpleNamespace(busId=f"00000000:0{self.links[h][link]}:00.0".upper())


def test_nvml_links_group_gpus_into_nvlink_domains() -> None:
    nvml = _FakeNvml({0: [1], 1: [0], 2: [3], 3: [2]})
    inv = discover("gpu-node", nvml=nvml, rack="r7")
    assert isinstance(inv, NodeInventory)
    assert inv.source == "nvml"
    assert inv.model == "NVIDIA H100 80GB HBM3"
    assert inv.gpus[0].memory_gib == 80.0
    assert inv.nvlink_domains == ((0, 1), (2, 3))
    assert inv.rack == "r7"
    assert nvml.shut_down


def test_nvml_that_fails_to_initialise_is_reported_as_unavailable() -> None:
    result = discover("n1", nvml=_FakeNvml({}, fail_init=True))
    assert isinstance(result, NvmlUnavailable)
    assert "Driver Not Loaded" in result.message


def test_nvswitch_p2p_status_joins_all_gpus_into_one_domain() -> None:
    nvml = _FakeNvml({})
    nvml.NVML_P2P_CAPS_INDEX_NVLINK = 3  # type: ignore[attr-defined]
    nvml.NVML_P2P_STATUS_OK = 0  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetP2PStatus = lambda a, b, caps: 0  # type: ignore[attr-defined]
    inv = discover("dgx", nvml=nvml)
    assert isinstance(inv, NodeInventory)
    assert inv.nvlink_domains == ((0, 1, 2, 3),)


def test_nvlink_domains_are_connected_components() -> None:
    assert nvlink_domains(6, [(0, 1), (1, 2), (4, 5)]) == ((0, 1, 2), (3,), (4, 5))
