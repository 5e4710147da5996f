"""The scheduling domain model: cluster shape, jobs, queues and the snapshot one cycle decides on.

Every type is a frozen, slotted dataclass so that a snapshot can be shared between phases (and
between the live services and the trace simulator) without anyone mutating it behind the
scheduler's back, and so that equal snapshots compare and hash equal (determinism is testable).
Only the standard library is used: the core must stay importable anywhere, including the simulator."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Final

# the policies `SchedulerConfig.named` knows, its baselines as (order, backfill, preemption) with neither reclaim
# nor quotas (module-level, not class attributes of the frozen, slotted dataclass: the core also builds with mypyc)
POLICIES: Final = ("corral", "fifo", "priority", "backfill", "las", "fair-las")
_BASELINES: Final = MappingProxyType({"fifo": ("fifo", False, False), "priority": ("priority", False, True),
                                      "backfill": ("fifo", True, False), "las": ("las", False, True)})


class NodeState(StrEnum):
    """Whether a node may receive new work; draining nodes keep running work but get nothing new."""

    READY = "ready"
    DRAINING = "draining"
    LOST = "lost"


class TopologyLevel(StrEnum):
    """Levels of the network hierarchy, from the tightest (NVLink inside a node) to the loosest."""

    NVLINK = "nvlink"
    NODE = "node"
    RACK = "rack"
    ZONE = "zone"

    @property
    def depth(self) -> int:
        """0 for NVLink up to 3 for zone: smaller is tighter."""
        return _LEVEL_DEPTH[self]


_LEVEL_DEPTH = MappingProxyType({lv: depth for depth, lv in enumerate(TopologyLevel)})  # NVLINK 0 ... ZONE 3


class OrderPolicy(StrEnum):
    """How pending jobs are ordered before allocation."""

    FAIR_SHARE = "fairshare"
    FIFO = "fifo"
    PRIORITY = "priority"
    LAS = "las"
    FAIR_LAS = "fairlas"


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU; `nvlink_domain` numbers the NVLink island inside its node."""

    index: int
    model: str
    memory_gib: int
    nvlink_domain: int = 0

    def __post_init__(self) -> None:
        if self.index < 0:
            raise ValueError(f"Gpu.index must be >= 0, got {self.index}")
        if self.memory_gib < 0:
            raise ValueError(f"Gpu.memory_gib must be >= 0, got {self.memory_gib}")


@dataclass(frozen=True, slots=True)
class Node:
    """A machine with GPUs; `rack` is its InfiniBand leaf/block, `zone` the group of racks."""

    name: str
    gpus: tuple[Gpu, ...]
    rack: str
    zone: str
    state: NodeState = NodeState.READY
    cpus: float | None = None  # host CPU cores and memory (None: not declared, never a limit)
    memory_gib: float | None = None
    datasets: frozenset[str] = frozenset()  # datasets this node holds (a job's mounts may need them)
    out_of_service: frozenset[int] = frozenset()  # GPUs taking no new work (unhealthy, drained): never free

    def __post_init__(self) -> None:
        indices = [g.index for g in self.gpus]
        if len(set(indices)) != len(indices):
            raise ValueError(f"Node {self.name!r}: GPU indices must be unique, got {indices}")
        if extra := sorted(self.out_of_service - set(indices)):
            raise ValueError(f"Node {self.name!r}: out_of_service names GPUs {extra} it does not have")

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def gpu(self, index: int) -> Gpu:
        for g in self.gpus:
            if g.index == index:
                return g
        raise KeyError(f"node {self.name!r} has no GPU {index}")

    def domains(self) -> dict[int, tuple[int, ...]]:
        """NVLink domain id -> GPU indices in it (sorted), the unit of the tightest topology."""
        out: dict[int, list[int]] = {}
        for g in self.gpus:
            out.setdefault(g.nvlink_domain, []).append(g.index)
        return {d: tuple(sorted(ix)) for d, ix in sorted(out.items())}


@dataclass(frozen=True, slots=True)
class Cluster:
    """The nodes the scheduler may use; node names are unique."""

    nodes: tuple[Node, ...]
    _by_name: dict[str, Node] = field(init=False, repr=False, compare=False, hash=False)
    # derived indexes of this (immutable) cluster, computed once by their owners (see
    # gpuset.ClusterIndex): a cache of pure functions of `nodes`, never part of its value
    memo: dict[object, object] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        by_name: dict[str, Node] = {}
        for n in self.nodes:
            if n.name in by_name:
                raise ValueError(f"Cluster.nodes: duplicate node name {n.name!r}; node names must be unique")
            by_name[n.name] = n
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "memo", {})

    def node(self, name: str) -> Node:
        return self._by_name[name]

    def has_node(self, name: str) -> bool:
        return name in self._by_name

    @property
    def total_gpus(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)

    @property
    def usable_gpus(self) -> int:
        """GPUs on nodes that are not lost: the capacity quotas are measured against."""
        return sum(len(n.gpus) for n in self.nodes if n.state is not NodeState.LOST)

    def racks(self) -> tuple[str, ...]:
        return tuple(sorted({n.rack for n in self.nodes}))

    def zones(self) -> tuple[str, ...]:
        return tuple(sorted({n.zone for n in self.nodes}))

    @classmethod
    def uniform(cls, nodes: int, gpus_per_node: int, model: str, memory_gib: int = 80, nodes_per_rack: int = 8,
                nvlink_domain_size: int | None = None, racks_per_zone: int | None = None) -> Cluster:
        """A homogeneous cluster: nodes n000.., racks r00.., zone z0 (or z0.. every racks_per_zone racks)."""
        if nodes < 0 or gpus_per_node < 0 or nodes_per_rack < 1:
            raise ValueError("Cluster.uniform: nodes and gpus_per_node must be >= 0, nodes_per_rack >= 1")
        domain = nvlink_domain_size or max(gpus_per_node, 1)
        width = max(3, len(str(max(nodes - 1, 0))))
        rack_count = max(1, -(-nodes // nodes_per_rack))
        rack_width = max(2, len(str(rack_count - 1)))
        built = []
        for i in range(nodes):
            rack_no = i // nodes_per_rack
            zone_no = rack_no // racks_per_zone if racks_per_zone else 0
            gpus = tuple(Gpu(j, model, memory_gib, j // domain) for j in range(gpus_per_node))
            built.append(Node(f"n{i:0{width}d}", gpus, f"r{rack_no:0{rack_width}d}", f"z{zone_no}"))
        return cls(tuple(built))


@dataclass(frozen=True, slots=True)
class Topology:
    """Placement constraints: `replica` and `gang` are hard, `prefer` is soft (pack tight up to there)."""

    replica: TopologyLevel | None = None
    gang: TopologyLevel | None = None
    prefer: TopologyLevel | None = None

    def __post_init__(self) -> None:
        if self.replica not in (None, TopologyLevel.NVLINK, TopologyLevel.NODE):
            raise ValueError(
                f"Topology.replica must be 'nvlink' or 'node' (a rank always lives on one node), got {self.replica!r}"
            )


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """Which GPUs a job accepts; None means any."""

    model: str | None = None
    min_memory_gib: int | None = None
    #: Host CPUs and memory a rank needs per GPU it holds. A GPU carries its share of its node's
    #: (node CPUs / node GPUs): as GPUs are exclusive, jobs that fit their shares never oversubscribe
    #: a node (Slurm's CPUs-per-GPU). A node that declares no capacity is not limited.
    cpus_per_gpu: float | None = None
    memory_gib_per_gpu: float | None = None
    datasets: frozenset[str] = frozenset()  # only nodes holding all of these (node-local data)

    @property
    def is_any(self) -> bool:
        return (self.model is None and self.min_memory_gib is None and self.cpus_per_gpu is None
                and self.memory_gib_per_gpu is None and not self.datasets)

    def matches(self, gpu: Gpu) -> bool:
        if self.model is not None and gpu.model != self.model:
            return False
        return self.min_memory_gib is None or gpu.memory_gib >= self.min_memory_gib

    def fits_node(self, node: Node) -> bool:
        """Whether `node` gives each of its GPUs enough host CPU and memory, and has the datasets."""
        share = len(node.gpus) or 1
        if self.cpus_per_gpu is not None and node.cpus is not None and self.cpus_per_gpu * share > node.cpus:
            return False
        if self.memory_gib_per_gpu is not None and node.memory_gib is not None \
                and self.memory_gib_per_gpu * share > node.memory_gib:
            return False
        return self.datasets <= node.datasets

    def describe(self) -> str:
        parts = []
        if self.model is not None:
            parts.append(self.model)
        if self.min_memory_gib is not None:
            parts.append(f">= {self.min_memory_gib} GiB")
        if not parts:
            parts.append("any GPU")
        if self.cpus_per_gpu is not None:
            parts.append(f"with >= {self.cpus_per_gpu:g} host CPUs per GPU")
        if self.memory_gib_per_gpu is not None:
            parts.append(f"with >= {self.memory_gib_per_gpu:g} GiB host memory per GPU")
        if self.datasets:
            parts.append("on a node with dataset " + ", ".join(sorted(self.datasets)))
        return " ".join(parts)




@dataclass(frozen=True, slots=True)
class Job:
    """A gang of `replicas` ranks, each asking `gpus_per_replica` whole GPUs on one node."""

    id: str
    queue: str
    replicas: int
    gpus_per_replica: int
    submit_time: float
    priority: int = 0
    gpu: GpuRequest | None = None
    topology: Topology = Topology()
    preemptible: bool = True
    checkpoint_grace_seconds: int = 30
    min_runtime_seconds: int = 0
    estimated_runtime_seconds: float | None = None
    user: str | None = None  # who submitted it: per-user limits (`core.user_gpus`); None: not limited

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("Job.id must be a non-empty string")
        if not self.queue:
            raise ValueError(f"Job {self.id!r}: queue must be a non-empty queue name like 'research/nlp'")
        if self.replicas < 1:
            raise ValueError(f"Job {self.id!r}: replicas must be >= 1, got {self.replicas}")
        if self.gpus_per_replica < 1:
            raise ValueError(f"Job {self.id!r}: gpus_per_replica must be >= 1, got {self.gpus_per_replica}")
        if self.checkpoint_grace_seconds < 0 or self.min_runtime_seconds < 0:
            raise ValueError(f"Job {self.id!r}: checkpoint_grace_seconds and min_runtime_seconds must be >= 0")
        if self.estimated_runtime_seconds is not None and self.estimated_runtime_seconds < 0:
            raise ValueError(f"Job {self.id!r}: estimated_runtime_seconds must be >= 0 or omitted")

    @property
    def total_gpus(self) -> int:
        return self.replicas * self.gpus_per_replica

    @property
    def shape(self) -> str:
        """Human form of the request used in reasons, e.g. '4x8 GPUs'."""
        return f"{self.replicas}x{self.gpus_per_replica} GPUs"


@dataclass(frozen=True, slots=True)
class RankPlacement:
    """Where one rank of a gang runs: a node and the GPU indices on it."""

    rank: int
    node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where every rank of a gang runs; a placement always covers the whole gang."""

    ranks: tuple[RankPlacement, ...]
    # counted once: preemption and quota accounting ask for it thousands of times per cycle
    gpu_count: int = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpu_count", sum(len(r.gpus) for r in self.ranks))

    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({r.node for r in self.ranks}))

    def gpus_by_node(self) -> dict[str, tuple[int, ...]]:
        out: dict[str, list[int]] = {}
        for r in self.ranks:
            out.setdefault(r.node, []).extend(r.gpus)
        return {n: tuple(sorted(g)) for n, g in sorted(out.items())}


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job holding GPUs. `preempting` means it was asked to checkpoint and still holds its GPUs.

    `attained_gpu_seconds` is service attained in earlier runs (LAS adds the current run to it); `preempted_by`
    lists preemptors that already preempted it once, so they never do again; `preempted_at` holds when its earlier
    attempts were asked to checkpoint (the preemption budget, `SchedulerConfig.preemption_budget`, spares a job
    preempted that often lately); `promoted_service`: its service at its promotion (`levels.running_level`)."""

    job: Job
    placement: Placement
    start_time: float
    last_checkpoint_time: float | None = None
    preempting: bool = False
    attained_gpu_seconds: float = 0.0
    preempted_by: frozenset[str] = frozenset()
    preempted_at: tuple[float, ...] = ()
    promoted_service: float | None = None

    def attained(self, now: float) -> float:
        return self.attained_gpu_seconds + max(0.0, now - self.start_time) * self.job.total_gpus

    def lost_work(self, now: float) -> float:
        """GPU-seconds of work lost if preempted now: time since the last checkpoint (or the start)."""
        since = (
            self.start_time if self.last_checkpoint_time is None else max(self.start_time, self.last_checkpoint_time)
        )
        return max(0.0, now - since) * self.job.total_gpus

    def expected_end(self) -> float | None:
        est = self.job.estimated_runtime_seconds
        return None if est is None else self.start_time + est


@dataclass(frozen=True, slots=True)
class PendingJob:
    """A waiting job: attained service (LAS), preemptors that hit it and when (kept when it runs)."""

    job: Job
    attained_gpu_seconds: float = 0.0
    preempted_by: frozenset[str] = frozenset()
    preempted_at: tuple[float, ...] = ()
    requeued_at: float | None = None  # when it last gave its GPUs back (None: it never ran)
    last_run_seconds: float = 0.0  # how long that run was (the starvation limit, `levels.promote_at`)


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """A node of the queue tree ('research/nlp' is a child of 'research').

    guaranteed_gpus: nominal quota, always reachable (by reclaim if lent away);
    max_gpus: hard ceiling including borrowing; lend_limit: how much unused guarantee others may
    borrow (None = all of it); weight: share of the surplus relative to siblings;
    max_gpus_per_user: GPUs one user's jobs may hold at once in its subtree (`core.user_gpus`;
    None: no limit)."""

    name: str
    guaranteed_gpus: int = 0
    max_gpus: int | None = None
    lend_limit: int | None = None
    weight: float = 1.0
    max_gpus_per_user: int | None = None

    def __post_init__(self) -> None:
        if not self.name or self.name.startswith("/") or self.name.endswith("/") or "//" in self.name:
            raise ValueError(f"QueueConfig.name must be like 'research' or 'research/nlp', got {self.name!r}")
        if self.guaranteed_gpus < 0:
            raise ValueError(f"queue {self.name}: guaranteed_gpus must be >= 0, got {self.guaranteed_gpus}")
        if self.max_gpus is not None and self.max_gpus < self.guaranteed_gpus:
            raise ValueError(
                f"queue {self.name}: max_gpus ({self.max_gpus}) must be >= guaranteed_gpus "
                f"({self.guaranteed_gpus}) or omitted"
            )
        if self.lend_limit is not None and self.lend_limit < 0:
            raise ValueError(f"queue {self.name}: lend_limit must be >= 0 or omitted")
        if not self.weight > 0:
            raise ValueError(f"queue {self.name}: weight must be > 0, got {self.weight}")
        if self.max_gpus_per_user is not None and self.max_gpus_per_user < 1:
            raise ValueError(f"queue {self.name}: max_gpus_per_user must be >= 1 or omitted")

    @property
    def parent(self) -> str | None:
        head, sep, _ = self.name.rpartition("/")
        return head if sep else None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one scheduling cycle looks at; `now` is passed in because the core has no clock."""

    now: float
    cluster: Cluster
    queues: tuple[QueueConfig, ...]
    pending: tuple[PendingJob, ...]
    running: tuple[RunningJob, ...]


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Which actions a cycle runs. `SchedulerConfig.named` gives the policies the simulator compares.
    quotas: enforce guarantee/borrowing limits (max_gpus is always enforced); las_preemption_ratio: under LAS, a
    pending job may preempt a running one whose attained service is at least this many times its own (and more than
    `las_min_gap_gpu_seconds` apart); preemption_budget: a job already preempted this many times within the last
    `preemption_budget_seconds` is no victim until the oldest of them ages out (no preemption loops, as Slurm's
    PreemptExemptTime and KAI's min-runtime protect). 0 turns it off; FAIR_LAS: `las_thresholds` end each service
    level in attained GPU-seconds (`levels`), and a level victim is taken `level_victim_fresh_seconds` after its
    checkpoint at most (`eligibility.fresh`); `starvation_limit`: `levels.promote_at` (0: off)."""

    order: OrderPolicy = OrderPolicy.FAIR_SHARE
    backfill: bool = True
    preemption: bool = True
    reclaim: bool = True
    quotas: bool = True
    las_preemption_ratio: float = 2.0
    las_min_gap_gpu_seconds: float = 3600.0
    preemption_budget: int = 2
    preemption_budget_seconds: float = 600.0
    las_thresholds: tuple[float, ...] = (28800.0,)
    level_victim_fresh_seconds: float = 600.0
    starvation_limit: float = 4.0  # FAIR_LAS: a job waiting this many times its last run leads its queue
    promotion_resets_level: bool = False  # FAIR_LAS: a promoted job preempts as level 0 both ways (`levels`)
    promotion_arrives: bool = False  # FAIR_LAS: a promoted job joins level 0 as if submitted at its promotion
    defragment: bool = False  # FAIR_LAS: move smaller jobs to make a whole node for a gang (`eligibility.defragments`)
    level_protection_seconds: float = 0.0  # FAIR_LAS: level-victim protection per past preemption (`protection`)
    level_protection_count: int = 0  # FAIR_LAS: a job preempted this many times is no level victim (0: off)

    @classmethod
    def named(cls, policy: str) -> SchedulerConfig:
        """One of `POLICIES`: corral (fair share), fair-las, or a baseline (see the package docstring)."""
        if policy == "corral":
            return cls()
        if policy == "fair-las":  # a promotion restarts the job at level 0, behind the jobs waiting there (`levels`)
            return cls(OrderPolicy.FAIR_LAS, promotion_resets_level=True, promotion_arrives=True)
        if policy not in _BASELINES:
            raise ValueError(f"unknown scheduling policy {policy!r}; choose one of {', '.join(POLICIES)}")
        order, backfill, preemption = _BASELINES[policy]
        return cls(OrderPolicy(order), backfill=backfill, preemption=preemption, reclaim=False, quotas=False)
