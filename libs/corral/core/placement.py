"""Gang placement as a pipeline of filter and score plugins, in the kube-scheduler style.

Filters decide whether a node can host ranks at all (node state, GPU model/memory, free GPUs,
hard replica topology); they produce a node's *slot count*: how many ranks of the job it can take.
Scores pick among feasible groups: tightness first (the whole gang inside one NVLink domain, then
one node, one rack, one zone, and only then spread over as few racks and nodes as possible), then
bin-packing (best fit: the fullest group that still fits, so that whole domains and nodes stay
free for big gangs). The gang is placed as a whole or not at all: `find_placement` returns a full
`Placement` or a `Reason` and never touches the index; callers take the GPUs (through a Statement).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from corral.core.decisions import Reason, ReasonCode
from corral.core.gpuset import FreeGpus, indices_of
from corral.core.model import Cluster, GpuRequest, Job, Node, NodeState, Placement, RankPlacement, TopologyLevel

_SCOPE = MappingProxyType({
    None: "",
    TopologyLevel.NVLINK: " inside one NVLink domain",
    TopologyLevel.NODE: " on one node",
    TopologyLevel.RACK: " inside one rack",
    TopologyLevel.ZONE: " inside one zone",
})


@dataclass(slots=True)
class GangRequest:
    """The job's shape against one index: what a filter needs to count a node's slots."""

    fi: FreeGpus
    replicas: int
    k: int
    nvlink_replica: bool
    all_match: bool
    match: list[int]
    only: tuple[int, int] | None = None  # (node, domain mask) once a whole-gang domain is chosen

    @property
    def total(self) -> int:
        return self.replicas * self.k


# -- filter plugins: each narrows what a node can offer; together they give its slot count --------


def filter_node_eligible(req: GangRequest, i: int) -> bool:
    """Only READY nodes take new work (draining and lost nodes are never offered)."""
    return req.fi.eligible[i]


def filter_gpu_match(req: GangRequest, i: int) -> int:
    """Free GPUs of the node that satisfy the job's model and memory request."""
    return req.fi.free[i] & req.match[i]


def filter_replica_topology(req: GangRequest, i: int, usable: int) -> int:
    """Ranks that fit: a rank lives on one node, and inside one NVLink domain if the job says so."""
    if req.nvlink_replica:
        return sum((usable & d).bit_count() // req.k for d in req.fi.domains[i])
    return usable.bit_count() // req.k


def node_slots(req: GangRequest, i: int) -> int:
    if not filter_node_eligible(req, i):
        return 0
    return filter_replica_topology(req, i, filter_gpu_match(req, i))


# -- score plugins: best fit inside a group, tightest group first ----------------------------------


def _pack(req: GangRequest, nodes: list[int], need: int) -> list[tuple[int, int]] | None:
    """Fewest nodes for `need` ranks, the last one best-fit (bin-packing); None if they do not fit."""
    slotted = [(s, i) for i in nodes if (s := node_slots(req, i)) > 0]
    if sum(s for s, _ in slotted) < need:
        return None
    slotted.sort(key=lambda si: -si[0])  # stable: ties keep cluster order
    chosen: list[tuple[int, int]] = []
    rem = need
    pos = 0
    while rem > 0:
        if slotted[pos][0] >= rem:
            best = min((si for si in slotted[pos:] if si[0] >= rem), key=lambda si: si[0])
            chosen.append((best[1], rem))
            return chosen
        s, i = slotted[pos]
        chosen.append((i, s))
        rem -= s
        pos += 1
    return chosen


def _spread(req: GangRequest, groups: list[list[int]], need: int) -> list[tuple[int, int]] | None:
    """Fewest groups (racks) for `need` ranks, the last one best-fit, then fewest nodes inside."""
    caps = []
    for g in groups:
        c = sum(node_slots(req, i) for i in g)
        if c > 0:
            caps.append((c, g))
    if sum(c for c, _ in caps) < need:
        return None
    caps.sort(key=lambda cg: -cg[0])
    out: list[tuple[int, int]] = []
    rem = need
    pos = 0
    while rem > 0:
        if caps[pos][0] >= rem:
            best = min((cg for cg in caps[pos:] if cg[0] >= rem), key=lambda cg: cg[0])
            packed = _pack(req, best[1], rem)
            assert packed is not None
            return out + packed
        c, g = caps[pos]
        packed = _pack(req, g, c)
        assert packed is not None
        out.extend(packed)
        rem -= c
        pos += 1
    return out


def _pick_gpus(req: GangRequest, i: int, n: int) -> list[tuple[int, ...]]:
    """GPUs for `n` ranks on node i: each rank best-fit into one NVLink domain when it can."""
    fi = req.fi
    usable = fi.free[i] & req.match[i]
    if req.only is not None and req.only[0] == i:
        usable &= req.only[1]
    doms = fi.domains[i]
    ranks: list[tuple[int, ...]] = []
    for _ in range(n):
        fitting = [(c, d) for d, dm in enumerate(doms) if (c := (usable & dm).bit_count()) >= req.k]
        if fitting:
            _, d = min(fitting)
            chosen = indices_of(usable & doms[d])[: req.k]
        else:
            assert not req.nvlink_replica
            chosen_l: list[int] = []
            for _, d in sorted(((usable & dm).bit_count(), d) for d, dm in enumerate(doms))[::-1]:
                chosen_l.extend(indices_of(usable & doms[d])[: req.k - len(chosen_l)])
                if len(chosen_l) == req.k:
                    break
            chosen = tuple(sorted(chosen_l))
        for g in chosen:
            usable &= ~(1 << g)
        ranks.append(tuple(chosen))
    return ranks


def _to_placement(req: GangRequest, chosen: list[tuple[int, int]]) -> Placement:
    ranks: list[RankPlacement] = []
    for i, n in chosen:
        for gpus in _pick_gpus(req, i, n):
            ranks.append(RankPlacement(len(ranks), req.fi.names[i], gpus))
    return Placement(tuple(ranks))


def _in_one_domain(req: GangRequest) -> list[tuple[int, int]] | None:
    """The whole gang inside one NVLink domain: the fullest domain that still fits."""
    fi, total = req.fi, req.total
    if req.all_match:
        for c in range(total, fi.max_domain + 1):
            if fi.dom_buckets[c]:
                # the first in node order: the choice depends only on which GPUs are free
                i, d = min(fi.dom_buckets[c])
                req.only = (i, fi.domains[i][d])
                return [(i, req.replicas)]
        return None
    best: tuple[int, int, int] | None = None
    for i in range(len(fi.names)):
        if fi.eligible[i]:
            usable = fi.free[i] & req.match[i]
            for dm in fi.domains[i]:
                c = (usable & dm).bit_count()
                if c >= total and (best is None or c < best[0]):
                    best = (c, i, dm)
    if best is None:
        return None
    req.only = (best[1], best[2])
    return [(best[1], req.replicas)]


def _in_one_node(req: GangRequest) -> list[tuple[int, int]] | None:
    """The whole gang on one node: the fullest node that still fits."""
    fi, total = req.fi, req.total
    if req.all_match:
        for c in range(total, fi.max_node + 1):
            bucket = fi.node_buckets[c]
            if not bucket:
                continue
            if not req.nvlink_replica:
                return [(min(bucket), req.replicas)]  # first in node order, as above
            for i in sorted(bucket):
                if node_slots(req, i) >= req.replicas:
                    return [(i, req.replicas)]
        return None
    best: tuple[int, int] | None = None
    for i in range(len(fi.names)):
        if node_slots(req, i) >= req.replicas:
            c = filter_gpu_match(req, i).bit_count()
            if best is None or c < best[0]:
                best = (c, i)
    return None if best is None else [(best[1], req.replicas)]


def _group_free(req: GangRequest, groups: list[list[int]], totals: list[int]) -> list[int]:
    if req.all_match:
        return totals
    return [sum(filter_gpu_match(req, i).bit_count() for i in g) for g in groups]


def _in_one_group(req: GangRequest, groups: list[list[int]], totals: list[int]) -> list[tuple[int, int]] | None:
    """The whole gang inside one rack (or zone): the fullest group that fits."""
    free = _group_free(req, groups, totals)
    order = sorted((f, g) for g, f in enumerate(free) if f >= req.total)
    for _, g in order:
        packed = _pack(req, groups[g], req.replicas)
        if packed is not None:
            return packed
    return None


def cluster_capacity(req: GangRequest) -> int:
    """Ranks the whole cluster could take now (O(buckets) when every GPU matches)."""
    fi, k = req.fi, req.k
    if req.all_match:
        if req.nvlink_replica:
            return sum(len(b) * (c // k) for c, b in enumerate(fi.dom_buckets) if c >= k)
        return sum(len(b) * (c // k) for c, b in enumerate(fi.node_buckets) if c >= k)
    return sum(node_slots(req, i) for i in range(len(fi.names)))


def request_for(fi: FreeGpus, job: Job) -> GangRequest:
    all_match, match = fi.match_masks(job.gpu)
    return GangRequest(
        fi, job.replicas, job.gpus_per_replica, job.topology.replica is TopologyLevel.NVLINK, all_match, match
    )


def find_placement(cluster: Cluster, free: FreeGpus, job: Job) -> Placement | Reason:
    """The tightest, best-packed placement of the whole gang on `free`, or why there is none.

    `cluster` must be the cluster `free` indexes (it is accepted for the service-facing signature).
    Hard topology (`topology.gang`, `topology.replica`) is never violated.
    """
    if free.cluster is not cluster and free.cluster != cluster:
        raise ValueError("find_placement: `free` indexes a different cluster than `cluster`")
    req = request_for(free, job)
    chosen = _place(req, job)
    if chosen is not None:
        return _to_placement(req, chosen)
    return _no_fit_reason(req, job)


def placement_or_none(free: FreeGpus, job: Job) -> Placement | None:
    """`find_placement`'s Placement, or None without the Reason (for callers that drop it)."""
    req = request_for(free, job)
    chosen = _place(req, job)
    return None if chosen is None else _to_placement(req, chosen)


def fits_now(free: FreeGpus, job: Job) -> bool:
    """Whether `find_placement` would place the whole gang on `free`, without building the
    Placement or, when it does not fit, the Reason: searches that try many what-ifs (a backfill
    reservation's prefixes of releases, a preemption plan's prefixes of victims) need only that.

    Without a hard gang level the counts answer alone: `_place` then ends, if nothing tighter
    fits, by spreading over racks (or zones), which fails only when the groups' slots sum to fewer
    than the replicas -- the cluster's capacity, which `_place` checks first."""
    req = request_for(free, job)
    if job.topology.gang is None:
        enough = (free.total_free if req.all_match else 1 << 62) >= req.total
        return enough and cluster_capacity(req) >= req.replicas
    return _place(req, job) is not None


def _place(req: GangRequest, job: Job) -> list[tuple[int, int]] | None:
    fi = req.fi
    hard = job.topology.gang
    limit = 4 if hard is None else hard.depth
    if (fi.total_free if req.all_match else 1 << 62) < req.total or cluster_capacity(req) < req.replicas:
        return None
    if limit == 0:
        return _in_one_domain(req) if req.total <= fi.max_domain else None
    if req.total <= fi.max_domain and not fi.single_domain:
        found = _in_one_domain(req)
        if found is not None:
            return found
    if limit >= 1 and req.total <= fi.max_node:
        found = _in_one_node(req)
        if found is not None or limit == 1:
            return found
    if limit == 1:
        return None
    if limit >= 2 and len(fi.racks) > 1:
        found = _in_one_group(req, fi.rack_nodes, fi.rack_free)
        if found is not None or limit == 2:
            return found
    if limit >= 3 and len(fi.zones) > 1:
        for z in sorted(
            range(len(fi.zones)),
            key=lambda z: (_group_free(req, [fi.zone_nodes[z]], [fi.zone_free[z]])[0], z),
        ):
            racks = [[i for i in fi.rack_nodes[r] if fi.node_zone[i] == z] for r in range(len(fi.racks))]
            found = _spread(req, [g for g in racks if g], req.replicas)
            if found is not None:
                return found
        if limit == 3:
            return None
    if job.topology.prefer is TopologyLevel.ZONE and len(fi.zones) > 1:
        return _spread(req, fi.zone_nodes, req.replicas)
    return _spread(req, fi.rack_nodes, req.replicas)


def _no_fit_reason(req: GangRequest, job: Job) -> Reason:
    fi = req.fi
    hard = job.topology.gang
    free_total = (
        fi.total_free
        if req.all_match
        else sum(filter_gpu_match(req, i).bit_count() for i in range(len(fi.names)) if fi.eligible[i])
    )
    scope = _SCOPE[hard]
    details: list[tuple[str, int | float | str]] = [
        ("needs_gpus", req.total),
        ("free_gpus", free_total),
    ]
    if free_total < req.total:
        msg = f"needs {job.shape}{scope}; {free_total} matching GPUs are free in the cluster"
    elif hard is TopologyLevel.RACK or hard is TopologyLevel.ZONE:
        groups = fi.rack_nodes if hard is TopologyLevel.RACK else fi.zone_nodes
        totals = fi.rack_free if hard is TopologyLevel.RACK else fi.zone_free
        gfree = _group_free(req, groups, totals)
        g = max(range(len(gfree)), key=lambda g: (gfree[g], -g))
        slots = sum(node_slots(req, i) for i in groups[g])
        msg = (
            f"needs {job.shape}{scope}; best {hard.value} has {gfree[g]} free GPUs, "
            f"room for {slots} of {job.replicas} ranks"
        )
        details.append(("best_group_free", gfree[g]))
    elif hard is TopologyLevel.NODE or hard is TopologyLevel.NVLINK:
        unit = "node" if hard is TopologyLevel.NODE else "NVLink domain"
        if req.all_match:
            buckets = fi.node_buckets if hard is TopologyLevel.NODE else fi.dom_buckets
            best = max((c for c, b in enumerate(buckets) if b), default=0)
        else:
            best = max(
                (filter_gpu_match(req, i).bit_count() for i in range(len(fi.names)) if fi.eligible[i]),
                default=0,
            )
        msg = f"needs {job.shape}{scope}; best {unit} has {best} free GPUs"
        details.append(("best_group_free", best))
    else:
        cap = cluster_capacity(req)
        msg = (
            f"needs {job.shape}; {free_total} matching GPUs are free but fragmented: "
            f"room for {cap} of {job.replicas} ranks"
        )
        details.append(("fitting_ranks", cap))
    return Reason(ReasonCode.GANG_DOES_NOT_FIT, msg, tuple(details))


def idle_index(cluster: Cluster) -> FreeGpus:
    """Every GPU of every node that is not lost, free: the cluster's shape for admission checks."""
    return FreeGpus(cluster, frozenset({NodeState.READY, NodeState.DRAINING}), in_service_only=False)


def shape_index(cluster: Cluster) -> FreeGpus:
    """Every GPU of every node, lost ones and GPUs out of service too, free: what can ever fit,
    for a verdict that is final (admission's): a lost node, an unhealthy GPU may come back."""
    return FreeGpus(cluster, frozenset(NodeState), in_service_only=False)


def _node_offer(request: GpuRequest, nodes: tuple[Node, ...]) -> str:
    """What the best nodes offer of what `request` needs of a node, for a refusal."""
    said = []
    if request.cpus_per_gpu is not None:
        cpus = [n.cpus / len(n.gpus) for n in nodes if n.cpus is not None and n.gpus]
        said.append(f"at most {max(cpus):g} host CPUs per GPU" if cpus else "no declared CPUs")
    if request.memory_gib_per_gpu is not None:
        memory = [n.memory_gib / len(n.gpus) for n in nodes if n.memory_gib is not None and n.gpus]
        said.append(f"at most {max(memory):g} GiB host memory per GPU" if memory else "no declared memory")
    if request.datasets:
        said.append("datasets " + (", ".join(sorted({d for n in nodes for d in n.datasets})) or "none"))
    return "; its nodes give " + ", ".join(said) if said else ""


def static_feasibility(cluster: Cluster, job: Job, idle: FreeGpus | None = None) -> Reason | None:
    """None when the job could fit this cluster's shape if it were idle; else why it never can.

    Admission uses it to reject at submit time what no amount of waiting would place.
    `idle` may be passed (from `idle_index`) to avoid rebuilding it for every job.
    """
    fi = idle if idle is not None else idle_index(cluster)
    req = request_for(fi, job)
    if not any(m for i, m in enumerate(req.match) if fi.eligible[i]):
        have = sorted({f"{g.model} {g.memory_gib} GiB" for n in cluster.nodes for g in n.gpus})
        want = job.gpu.describe() if job.gpu is not None else "any GPU"
        return Reason(
            ReasonCode.NO_MATCHING_GPU,
            f"no GPU in the cluster matches {want}; it has {', '.join(have) or 'no GPUs'}"
            + (_node_offer(job.gpu, cluster.nodes) if job.gpu is not None else ""),
            (("needs_gpus", job.total_gpus),),
        )
    if _place(req, job) is not None:
        return None
    unit = "NVLink domain" if req.nvlink_replica else "node"
    best_unit = max(
        (filter_replica_topology(req, i, req.match[i]) for i in range(len(fi.names)) if fi.eligible[i]),
        default=0,
    )
    if best_unit == 0:
        biggest = max(
            (
                (m & d).bit_count() if req.nvlink_replica else m.bit_count()
                for i, m in enumerate(req.match)
                if fi.eligible[i]
                for d in (fi.domains[i] if req.nvlink_replica else (m,))
            ),
            default=0,
        )
        msg = f"a rank needs {job.gpus_per_replica} GPUs in one {unit}; the largest {unit} has {biggest}"
    else:
        scope = _SCOPE[job.topology.gang]
        msg = f"needs {job.shape}{scope}; this cluster cannot hold it even when idle"
    return Reason(ReasonCode.TOPOLOGY_UNSATISFIABLE, msg, (("needs_gpus", job.total_gpus),))
