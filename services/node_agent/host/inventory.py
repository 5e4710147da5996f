"""What GPUs a node has: discovered through NVML, or declared for machines without a GPU.

Why: placement needs each node's GPU count, model, memory and NVLink domains (the `gang: nvlink`
topology constraint packs a job into one domain). On a real node NVML tells us; on a laptop or a CI
machine a declared fake inventory stands in, so one machine can host many fake nodes. A machine
without NVML is an expected situation, so it is a value (`NvmlUnavailable`), not an exception.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

_GIB = 1024**3


@dataclass(frozen=True)
class Gpu:
    """One GPU as the node agent sees it."""

    index: int
    model: str
    memory_gib: float
    uuid: str | None = None


@dataclass(frozen=True)
class NodeInventory:
    """A node's GPUs and where it sits; `nvlink_domains` partition the GPU indices."""

    node: str
    gpus: tuple[Gpu, ...]
    nvlink_domains: tuple[tuple[int, ...], ...]
    rack: str | None = None
    zone: str | None = None
    source: str = "declared"  # "nvml" or "declared"
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def model(self) -> str | None:
        """The GPU model when the node is homogeneous (the usual case), else None."""
        models = {gpu.model for gpu in self.gpus}
        return models.pop() if len(models) == 1 else None


@dataclass(frozen=True)
class NvmlUnavailable:
    """NVML could not be used here (no driver, no GPU): declare a fake inventory instead."""

    message: str


def nvlink_domains(gpu_count: int, links: Iterable[tuple[int, int]]) -> tuple[tuple[int, ...], ...]:
    """Group GPUs into NVLink domains: connected components of the NVLink graph.

    A GPU with no NVLink is a domain of its own. Output is sorted, so it is deterministic.
    """
    parent = list(range(gpu_count))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in links:
        if 0 <= a < gpu_count and 0 <= b < gpu_count:
            parent[root(a)] = root(b)
    groups: dict[int, list[int]] = {}
    for i in range(gpu_count):
        groups.setdefault(root(i), []).append(i)
    return tuple(sorted(tuple(sorted(g)) for g in groups.values()))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvlink_peers(nvml: Any, handle: Any, bus_to_index: Mapping[str, int]) -> list[int]:
    """Indices of the local GPUs this GPU has an active NVLink to (switch ends are not GPUs and are
    skipped; `_nvswitch_links` covers them)."""
    peers: list[int] = []
    max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
    for link in range(max_links):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != getattr(nvml, "NVML_FEATURE_ENABLED", 1):
                continue
            remote = nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
        except nvml.NVMLError:
            break  # link index beyond what this GPU has, or NVLink not supported
        peer = bus_to_index.get(_text(remote.busId).lower())
        if peer is not None:
            peers.append(peer)
    return peers


def discover(node: str, *, nvml: Any = None, rack: str | None = None,
             zone: str | None = None) -> NodeInventory | NvmlUnavailable:
    """Read the node's GPUs through NVML (`pynvml` from the nvidia-ml-py package).

    `nvml` may be passed to use another object with the pynvml API (tests inject a fake one).
    NVLink domains are the connected components of two kinds of evidence: active NVLink links
    whose remote PCI end is a local GPU (`nvmlDeviceGetNvLinkState`/`...RemotePciInfo`), and,
    for NVSwitch fabrics where the remote end is a switch, GPU pairs whose P2P status over NVLink
    is OK (`nvmlDeviceGetP2PStatus(..., NVML_P2P_CAPS_INDEX_NVLINK)`).
    """
    if nvml is None:
        try:
            import pynvml as nvml_module
        except ImportError:
            return NvmlUnavailable("the pynvml module is not installed (pip install nvidia-ml-py)")
        nvml = nvml_module
    try:
        nvml.nvmlInit()
    except Exception as exc:  # pynvml raises NVMLError subclasses; a broken driver may raise others
        return NvmlUnavailable(f"NVML is not available on this machine ({exc}); "
                               "declare a fake inventory for this node instead")
    try:
        count = int(nvml.nvmlDeviceGetCount())
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        gpus: list[Gpu] = []
        bus_to_index: dict[str, int] = {}
        for i, handle in enumerate(handles):
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            gpus.append(Gpu(index=i, model=_text(nvml.nvmlDeviceGetName(handle)),
                            memory_gib=round(int(memory.total) / _GIB, 1), uuid=_text(uuid)))
            bus_to_index[_text(nvml.nvmlDeviceGetPciInfo(handle).busId).lower()] = i
        links: list[tuple[int, int]] = []
        for i, handle in enumerate(handles):
            links.extend((i, peer) for peer in _nvlink_peers(nvml, handle, bus_to_index))
        links.extend(_nvswitch_links(nvml, handles))
        return NodeInventory(node=node, gpus=tuple(gpus), nvlink_domains=nvlink_domains(count, links),
                             rack=rack, zone=zone, source="nvml")
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _nvswitch_links(nvml: Any, handles: list[Any]) -> list[tuple[int, int]]:
    """Pairs that NVML says can talk peer-to-peer over NVLink (covers NVSwitch fabrics)."""
    status_fn = getattr(nvml, "nvmlDeviceGetP2PStatus", None)
    caps = getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", None)
    ok = getattr(nvml, "NVML_P2P_STATUS_OK", 0)
    if status_fn is None or caps is None:
        return []
    pairs: list[tuple[int, int]] = []
    for i in range(len(handles)):
        for j in range(i + 1, len(handles)):
            try:
                if status_fn(handles[i], handles[j], caps) == ok:
                    pairs.append((i, j))
            except nvml.NVMLError:
                return pairs
    return pairs


_FAKE_FIELDS = {"node", "model", "memory_gib", "gpus", "nvlink_domains", "rack", "zone", "labels"}


def declared_inventory(spec: Mapping[str, Any]) -> NodeInventory:
    """Build a fake inventory from a declaration, for machines without a GPU.

    Example: ``{node: n1, model: H100, memory_gib: 80, gpus: 8, nvlink_domains: [[0,1,2,3],[4,5,6,7]],
    rack: r1, zone: z1}``. `nvlink_domains` defaults to one domain per GPU (no NVLink). Raises
    ValueError naming the field when the declaration does not make sense.
    """
    unknown = set(spec) - _FAKE_FIELDS
    if unknown:
        raise ValueError(f"fake inventory: unknown field(s) {sorted(unknown)}; "
                         f"allowed: {sorted(_FAKE_FIELDS)}")
    for required in ("node", "model", "memory_gib", "gpus"):
        if required not in spec:
            raise ValueError(f"fake inventory: field '{required}' is required")
    node = spec["node"]
    if not isinstance(node, str) or not node:
        raise ValueError("fake inventory: field 'node' must be a non-empty string")
    count = spec["gpus"]
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ValueError(f"fake inventory {node}: field 'gpus' must be a non-negative integer, got {count!r}")
    memory = spec["memory_gib"]
    if not isinstance(memory, (int, float)) or isinstance(memory, bool) or memory <= 0:
        raise ValueError(f"fake inventory {node}: field 'memory_gib' must be a positive number, "
                         f"got {memory!r}")
    raw_domains = spec.get("nvlink_domains")
    domains: tuple[tuple[int, ...], ...]
    if raw_domains is None:
        domains = tuple((i,) for i in range(count))
    else:
        domains = _checked_domains(node, count, raw_domains)
    gpus = tuple(Gpu(index=i, model=str(spec["model"]), memory_gib=float(memory)) for i in range(count))
    labels = {str(k): str(v) for k, v in (spec.get("labels") or {}).items()}
    return NodeInventory(node=node, gpus=gpus, nvlink_domains=domains, rack=spec.get("rack"),
                         zone=spec.get("zone"), source="declared", labels=labels)


def _checked_domains(node: str, count: int, raw: Any) -> tuple[tuple[int, ...], ...]:
    if not isinstance(raw, list) or not all(isinstance(d, list) for d in raw):
        raise ValueError(f"fake inventory {node}: 'nvlink_domains' must be a list of lists of GPU indices")
    seen: set[int] = set()
    for domain in raw:
        for index in domain:
            if not isinstance(index, int) or not 0 <= index < count:
                raise ValueError(f"fake inventory {node}: 'nvlink_domains' has GPU index {index!r}, "
                                 f"expected 0..{count - 1}")
            if index in seen:
                raise ValueError(f"fake inventory {node}: GPU {index} appears in two 'nvlink_domains'")
            seen.add(index)
    singles = [[i] for i in range(count) if i not in seen]  # undeclared GPUs have no NVLink
    return tuple(sorted(tuple(sorted(d)) for d in [*raw, *singles] if d))


def load_declared_inventories(path: Path) -> list[NodeInventory]:
    """Read fake inventories from YAML: one mapping, a list of them, or `{nodes: [...]}`."""
    data = yaml.safe_load(path.read_text())
    if isinstance(data, Mapping) and "nodes" in data:
        data = data["nodes"]
    items = data if isinstance(data, list) else [data]
    if not all(isinstance(item, Mapping) for item in items):
        raise ValueError(f"{path}: expected a mapping, a list of mappings or {{nodes: [...]}}")
    return [declared_inventory(item) for item in items]
