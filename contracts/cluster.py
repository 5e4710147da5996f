"""ClusterSpec: the cluster file of `corral up` and `corral sim`, and the `4x8:H100` shorthand.

Why here: the embedded stack, the simulator and the node agents' fake inventories must read one
description of the hardware. A node's GPUs are grouped into NVLink domains (a DGX H100 is one
domain of 8; a PCIe box with bridges has pairs); nodes sit in racks, racks in zones.
`NodeSpec.inventory()` resolves defaults into the concrete `NodeInventory` that NodeRegistered
carries.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import msgspec

from corral.contracts.problems import Problem, SpecError
from corral.contracts.validation import convert_collecting, parse_document

__all__ = [
    "GPU_MEMORY_GIB",
    "ClusterSpec",
    "GpuDevice",
    "NodeInventory",
    "NodeSpec",
    "load_cluster_file",
    "load_cluster_text",
    "parse_cluster_shorthand",
    "read_cluster_file",
    "validate_cluster_spec",
]

#: Memory per GPU when a file or shorthand names only the model (the common SKU).
GPU_MEMORY_GIB: dict[str, float] = {
    "H100": 80.0, "H200": 141.0, "B200": 192.0, "GB200": 192.0, "A100": 80.0, "L40S": 48.0,
    "L4": 24.0, "A10G": 24.0, "V100": 32.0, "T4": 16.0,
}
DEFAULT_MEMORY_GIB = 80.0
NODES_PER_RACK = 8

NodeName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]
Location = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]
MAX_GPUS_PER_NODE = 1024
MAX_SHORTHAND_NODES = 100_000

GpuIndex = Annotated[int, msgspec.Meta(ge=0, lt=4096)]
Model = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
Memory = Annotated[float, msgspec.Meta(gt=0)]
Cpus = Annotated[int, msgspec.Meta(ge=1, le=65_536, description="CPU cores of the node")]
HostMemory = Annotated[float, msgspec.Meta(gt=0, description="host memory of the node in GiB")]
DatasetName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]
HostPath = Annotated[str, msgspec.Meta(pattern=r"^/[^\x00]*$", max_length=4096,
                                       description="an absolute path on the node")]
#: A dataset name -> where it is on a node (or on a shared filesystem every node mounts alike).
Datasets = dict[DatasetName, HostPath]


class GpuDevice(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One GPU of a node. In a file, `model`/`memory_gib` left out inherit the node's."""

    index: GpuIndex
    model: Model | None = None
    memory_gib: Memory | None = None


class NodeInventory(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A node's resolved hardware: every GPU with model and memory, NVLink domains covering all."""

    node: NodeName
    gpus: list[GpuDevice]
    nvlink_domains: list[list[GpuIndex]]
    rack: Location
    zone: Location
    cpus: Cpus | None = None
    host_memory_gib: HostMemory | None = None
    datasets: Datasets = msgspec.field(default_factory=dict)


class NodeSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: NodeName
    gpus: Annotated[int, msgspec.Meta(ge=0, le=MAX_GPUS_PER_NODE)] | Annotated[
        list[GpuDevice], msgspec.Meta(max_length=MAX_GPUS_PER_NODE)]
    model: Model
    memory_gib: Memory | None = None
    nvlink_domains: list[list[GpuIndex]] | None = None
    rack: Location = "rack-0"
    zone: Location = "zone-0"
    state: Literal["ready", "draining"] = "ready"
    cpus: Cpus | None = None
    host_memory_gib: HostMemory | None = None
    datasets: Datasets = msgspec.field(default_factory=dict)

    FIELD_HINTS: ClassVar[dict[str, str]] = {
        "name": "a node name such as node-0",
        "cpus": "the node's CPU cores, e.g. 96",
        "host_memory_gib": "the node's memory in GiB, e.g. 1024",
        "datasets": "a mapping of dataset name: absolute path on this node, e.g. {imagenet: /nvme/imagenet}",
        "gpus": "a GPU count (8) or a list of {index, model, memory_gib}",
        "model": "a GPU model such as H100",
        "memory_gib": "memory per GPU in GiB, e.g. 80",
        "nvlink_domains": "a list of lists of GPU indices, e.g. [[0,1,2,3],[4,5,6,7]]",
        "rack": "a rack name such as rack-0",
        "zone": "a zone name such as zone-0",
        "state": "use one of ready, draining",
    }

    def __post_init__(self) -> None:
        problems = self.sense_problems()
        if problems:
            raise SpecError(problems)

    def indices(self) -> list[int]:
        return list(range(self.gpus)) if isinstance(self.gpus, int) else [g.index for g in self.gpus]

    def sense_problems(self) -> list[Problem]:
        found: list[Problem] = []
        indices = self.indices()
        if len(set(indices)) != len(indices):
            found.append(Problem(path="gpus", message=f"GPU indices repeat: {sorted(indices)}",
                                 hint="give each GPU of a node its own index"))
        if self.nvlink_domains is not None:
            seen: set[int] = set()
            known = set(indices)
            for d, domain in enumerate(self.nvlink_domains):
                for gpu in domain:
                    if gpu not in known:
                        found.append(Problem(
                            path=f"nvlink_domains[{d}]", message=f"GPU {gpu} is not on this node",
                            hint=f"use indices among {sorted(known)}"))
                    elif gpu in seen:
                        found.append(Problem(
                            path=f"nvlink_domains[{d}]", message=f"GPU {gpu} is in two NVLink domains",
                            hint="a GPU belongs to exactly one NVLink domain"))
                    seen.add(gpu)
        return found

    def inventory(self, shared_datasets: dict[str, str] | None = None) -> NodeInventory:
        """Resolve defaults: per-GPU model/memory, and NVLink domains covering every GPU.

        A GPU left out of every listed domain is alone in its own domain (no NVLink peers).
        `shared_datasets` (the cluster's, on a shared filesystem) are on every node; the node's own
        `datasets` win over them.
        """
        node_memory = self.memory_gib or GPU_MEMORY_GIB.get(self.model.upper(), DEFAULT_MEMORY_GIB)
        listed = ([GpuDevice(index=i) for i in range(self.gpus)] if isinstance(self.gpus, int)
                  else sorted(self.gpus, key=lambda g: g.index))
        devices = []
        for g in listed:
            model = g.model or self.model
            memory = g.memory_gib or (node_memory if model == self.model
                                      else GPU_MEMORY_GIB.get(model.upper(), DEFAULT_MEMORY_GIB))
            devices.append(GpuDevice(index=g.index, model=model, memory_gib=memory))
        if self.nvlink_domains is None:
            domains = [[d.index for d in devices]] if devices else []
        else:
            domains = [sorted(d) for d in self.nvlink_domains if d]
            covered = {i for d in domains for i in d}
            domains.extend([d.index] for d in devices if d.index not in covered)
        return NodeInventory(node=self.name, gpus=devices, nvlink_domains=domains,
                             rack=self.rack, zone=self.zone, cpus=self.cpus, host_memory_gib=self.host_memory_gib,
                             datasets={**(shared_datasets or {}), **self.datasets})


class ClusterSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The nodes; `datasets` on a filesystem every node mounts at the same path; `checkpoint_dir`,
    a shared folder where jobs checkpoint by default (so a job resumes on any node)."""

    nodes: Annotated[list[NodeSpec], msgspec.Meta(min_length=1)]
    datasets: Datasets = msgspec.field(default_factory=dict)
    checkpoint_dir: HostPath | None = None

    FIELD_HINTS: ClassVar[dict[str, str]] = {
        "nodes": "a list of nodes: [{name, gpus, model}, ...]",
        "datasets": "a mapping of dataset name: absolute path on a filesystem every node mounts, "
                    "e.g. {imagenet: /shared/datasets/imagenet}",
        "checkpoint_dir": "an absolute folder on storage every node mounts, e.g. /shared/checkpoints",
    }

    def __post_init__(self) -> None:
        seen: dict[str, int] = {}
        problems = []
        for i, node in enumerate(self.nodes):
            if node.name in seen:
                problems.append(Problem(path=f"nodes[{i}].name",
                                        message=f"node `{node.name}` is also nodes[{seen[node.name]}]",
                                        hint="give every node a unique name"))
            seen.setdefault(node.name, i)
        if problems:
            raise SpecError(problems)

    @property
    def total_gpus(self) -> int:
        return sum(len(n.indices()) for n in self.nodes)

    def inventories(self) -> list[NodeInventory]:
        return [n.inventory(self.datasets) for n in self.nodes]


_SHORTHAND = re.compile(r"^(?P<nodes>\d+)x(?P<gpus>\d+)(?::(?P<model>[A-Za-z0-9][A-Za-z0-9._-]*))?"
                        r"(?::(?P<memory>\d+(?:\.\d+)?))?$")


def parse_cluster_shorthand(text: str, *, nodes_per_rack: int = NODES_PER_RACK) -> ClusterSpec:
    """`4x8:H100` = 4 nodes x 8 GPUs, model H100, each node one NVLink domain, racks of 8 nodes.

    Optional memory per GPU: `4x8:H100:80`; several groups: `2x8:H100,4x4:A100:40` (node names
    and racks continue across groups). Model defaults to H100.
    """
    problems: list[Problem] = []
    nodes: list[NodeSpec] = []
    for g, group in enumerate(part.strip() for part in text.split(",")):
        m = _SHORTHAND.match(group)
        if (m is None or not 1 <= int(m["nodes"]) <= MAX_SHORTHAND_NODES
                or int(m["gpus"]) > MAX_GPUS_PER_NODE):
            problems.append(Problem(path=f"cluster[{g}]" if "," in text else "cluster",
                                    message=f"cannot read cluster shorthand `{group}`",
                                    hint="write NODESxGPUS[:MODEL[:MEMORY_GIB]], e.g. 4x8:H100 or "
                                         f"2x8:A100:40 (1-{MAX_SHORTHAND_NODES} nodes, at most "
                                         f"{MAX_GPUS_PER_NODE} GPUs per node)"))
            continue
        for _ in range(int(m["nodes"])):
            i = len(nodes)
            nodes.append(NodeSpec(
                name=f"node-{i}", gpus=int(m["gpus"]), model=m["model"] or "H100",
                memory_gib=float(m["memory"]) if m["memory"] else None,
                rack=f"rack-{i // nodes_per_rack}", zone="zone-0"))
    if problems:
        raise SpecError(problems)
    return ClusterSpec(nodes=nodes)


def validate_cluster_spec(obj: Any) -> ClusterSpec:
    if isinstance(obj, list):  # a bare list of nodes is accepted too
        obj = {"nodes": obj}
    if not isinstance(obj, dict):
        raise SpecError([Problem(path="", message=f"a cluster file is a mapping, got {type(obj).__name__}",
                                 hint="start the file with `nodes:`")])
    return convert_collecting(obj, ClusterSpec)


def load_cluster_text(text: str, fmt: Literal["yaml", "json"] | None = None) -> ClusterSpec:
    return validate_cluster_spec(parse_document(text, fmt))


def read_cluster_file(path: Path) -> ClusterSpec:
    """A cluster file, or a file whose whole content is a shorthand like `4x8:H100`; SpecError
    names what is wrong, OSError says the file cannot be read."""
    text = path.read_text(encoding="utf-8").strip()
    if path.suffix.lower() not in (".json", ".yaml", ".yml") and "\n" not in text and ":" in text and ": " not in text:
        return parse_cluster_shorthand(text)
    return load_cluster_file(path)


def load_cluster_file(path: str | Path) -> ClusterSpec:
    """Read a YAML/JSON cluster file (format from the suffix; `.json` is JSON, otherwise YAML).

    This reads one file given by the caller; contracts do no other I/O.
    """
    p = Path(path)
    fmt: Literal["yaml", "json"] = "json" if p.suffix.lower() == ".json" else "yaml"
    return load_cluster_text(p.read_text(encoding="utf-8"), fmt)
