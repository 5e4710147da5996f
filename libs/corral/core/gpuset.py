"""FreeGpus: an index of free GPUs per node, NVLink domain, rack and zone, and a Statement journal.

Placement runs thousands of times per cycle, so free GPUs are bitmasks per node and nodes are
bucketed by free count; placement takes the first node in node order from a bucket, so its choice
depends only on which GPUs are free, never on the order of earlier takes and rollbacks.
Rack/zone/cluster free totals answer "can it fit at all?" in O(1) before any scan.
A `Statement` records allocations and releases so that a tentative gang allocation or a
preemption simulation can be rolled back exactly (Volcano's Statement, without the I/O).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from corral.core.model import Cluster, GpuRequest, NodeState, Placement, RunningJob


def mask_of(indices: Iterable[int]) -> int:
    m = 0
    for i in indices:
        m |= 1 << i
    return m


def indices_of(mask: int) -> tuple[int, ...]:
    out = []
    i = 0
    while mask:
        if mask & 1:
            out.append(i)
        mask >>= 1
        i += 1
    return tuple(out)


class ClusterIndex:
    """The cluster-static part of a FreeGpus index: names, racks, zones, NVLink domain masks,
    which nodes are eligible, and the answer to every GPU model/memory request seen so far.

    Why: a cycle builds a FreeGpus for every snapshot (and the simulator runs ~100,000 cycles on
    one unchanged cluster); deriving all of this from the Node objects each time cost more than
    the scheduling itself. A Cluster is immutable, so this is computed once per cluster and
    eligibility rule and kept on the cluster (`ClusterIndex.of`): a memo, not state.
    """

    __slots__ = (
        "all_masks",
        "cluster",
        "dom_counts",
        "domains",
        "eligible",
        "index_of",
        "match_cache",
        "max_domain",
        "max_node",
        "names",
        "node_rack",
        "node_zone",
        "placement_masks",
        "rack_nodes",
        "racks",
        "single_domain",
        "usable_masks",
        "zone_nodes",
        "zones",
    )

    def __init__(self, cluster: Cluster, eligible_states: frozenset[NodeState]):
        self.cluster = cluster
        nodes = cluster.nodes
        self.names = [n.name for n in nodes]
        self.index_of = {n.name: i for i, n in enumerate(nodes)}
        self.racks = sorted({n.rack for n in nodes})
        self.zones = sorted({n.zone for n in nodes})
        rack_ix = {r: i for i, r in enumerate(self.racks)}
        zone_ix = {z: i for i, z in enumerate(self.zones)}
        self.node_rack = [rack_ix[n.rack] for n in nodes]
        self.node_zone = [zone_ix[n.zone] for n in nodes]
        self.eligible = [n.state in eligible_states for n in nodes]
        self.all_masks = [mask_of(g.index for g in n.gpus) for n in nodes]
        # the GPUs that may ever be free: a GPU out of service (unhealthy, drained) never is
        self.usable_masks = [m & ~mask_of(n.out_of_service) for m, n in zip(self.all_masks, nodes, strict=True)]
        self.domains = [tuple(mask_of(ix) for ix in n.domains().values()) for n in nodes]
        self.dom_counts = [tuple(m.bit_count() for m in d) for d in self.domains]
        self.single_domain = all(len(d) <= 1 for d in self.domains)
        self.max_node = max((len(n.gpus) for n in nodes), default=0)
        self.max_domain = max((m.bit_count() for d in self.domains for m in d), default=0)
        self.rack_nodes: list[list[int]] = [[] for _ in self.racks]
        self.zone_nodes: list[list[int]] = [[] for _ in self.zones]
        for i in range(len(nodes)):
            if self.eligible[i]:
                self.rack_nodes[self.node_rack[i]].append(i)
                self.zone_nodes[self.node_zone[i]].append(i)
        self.match_cache: dict[GpuRequest, tuple[bool, list[int]]] = {}
        # placement -> per-node masks, by identity (running jobs keep their Placement object
        # from cycle to cycle); the entry keeps the placement alive so an id is never reused
        self.placement_masks: dict[int, tuple[Placement, tuple[tuple[int, int], ...]]] = {}

    def held_masks(self, r: RunningJob, used: Mapping[int, int]) -> tuple[tuple[int, int], ...]:
        """The running job's GPUs per node (`masks_of`), checked: its nodes exist and have those
        GPUs, and no GPU is already in `used` (a GPU has one holder)."""
        try:
            masks = self.masks_of(r.placement)
        except KeyError as missing:
            raise ValueError(
                f"running job {r.job.id!r} holds GPUs on node {missing.args[0]!r}, which is not in the "
                "cluster; keep lost nodes in Cluster.nodes with state 'lost' until their jobs end"
            ) from None
        for i, m in masks:
            if m & ~self.all_masks[i]:
                raise ValueError(
                    f"running job {r.job.id!r} holds GPUs {indices_of(m & ~self.all_masks[i])} that node "
                    f"{self.names[i]!r} does not have"
                )
            u = used.get(i, 0)
            if m & u:
                raise ValueError(
                    f"running job {r.job.id!r} holds GPUs {indices_of(m & u)} of node "
                    f"{self.names[i]!r} that another running job also holds; a GPU has one holder"
                )
        return masks

    @classmethod
    def of(cls, cluster: Cluster, eligible_states: frozenset[NodeState]) -> ClusterIndex:
        memo = cluster.memo
        key = ("ClusterIndex", eligible_states)
        found = memo.get(key)
        if found is None:
            found = memo[key] = cls(cluster, eligible_states)
        assert isinstance(found, ClusterIndex)
        return found

    def masks_of(self, placement: Placement) -> tuple[tuple[int, int], ...]:
        """(node index, GPU mask) per node the placement uses, sorted by node index."""
        hit = self.placement_masks.get(id(placement))
        if hit is not None and hit[0] is placement:
            return hit[1]
        by_node: dict[int, int] = {}
        index_of = self.index_of
        for rank in placement.ranks:
            i = index_of.get(rank.node)
            if i is None:
                raise KeyError(rank.node)
            m = 0
            for g in rank.gpus:
                m |= 1 << g
            by_node[i] = by_node.get(i, 0) | m
        masks = tuple(sorted(by_node.items()))
        if len(self.placement_masks) > 200_000:
            self.placement_masks.clear()
        self.placement_masks[id(placement)] = (placement, masks)
        return masks


class FreeGpus:
    """Free GPUs of a cluster as bitmasks, with buckets by free count for fast best-fit.

    Only nodes in state READY are eligible for new work (`eligible`); GPUs of other nodes are
    tracked but never offered. Node order is the cluster's node order. The cluster-static part
    is shared with every other index of the same cluster (`ClusterIndex`).
    """

    __slots__ = (
        "_match_cache",
        "all_masks",
        "cluster",
        "dom_buckets",
        "domains",
        "eligible",
        "free",
        "index_of",
        "max_domain",
        "max_node",
        "names",
        "node_buckets",
        "node_rack",
        "node_zone",
        "rack_free",
        "rack_nodes",
        "racks",
        "single_domain",
        "static",
        "total_free",
        "usable_masks",
        "zone_free",
        "zone_nodes",
        "zones",
    )
    static: ClusterIndex
    usable_masks: list[int]  # per node, the GPUs that may ever be free (not out of service)
    # the free GPUs (the rest is the cluster's): node index -> mask, counts, buckets by free count
    free: list[int]
    total_free: int
    rack_free: list[int]
    zone_free: list[int]
    node_buckets: list[dict[int, None]]
    dom_buckets: list[dict[tuple[int, int], None]]

    def __init__(
        self,
        cluster: Cluster,
        eligible_states: frozenset[NodeState] = frozenset({NodeState.READY}),
        *,
        used: Mapping[int, int] | None = None,
        like: FreeGpus | None = None,
        in_service_only: bool = True,
    ):
        """Every GPU free, except `used` (node index -> mask of GPUs taken) and the GPUs out of
        service (`Node.out_of_service`, unless `in_service_only` is False: the cluster's shape); or,
        given `like` (an index of the same cluster), the GPUs free there (`copy`)."""
        st = self.static = ClusterIndex.of(cluster, eligible_states) if like is None else like.static
        self.cluster = cluster
        self.names = st.names
        self.index_of = st.index_of
        self.racks = st.racks
        self.zones = st.zones
        self.node_rack = st.node_rack
        self.node_zone = st.node_zone
        self.eligible = st.eligible
        self.all_masks = st.all_masks
        self.domains = st.domains
        self.single_domain = st.single_domain
        self.max_node = st.max_node
        self.max_domain = st.max_domain
        self.rack_nodes = st.rack_nodes
        self.zone_nodes = st.zone_nodes
        self._match_cache = st.match_cache
        if like is not None:
            self.usable_masks = like.usable_masks
            self.free = like.free.copy()
            self.rack_free = like.rack_free.copy()
            self.zone_free = like.zone_free.copy()
            self.node_buckets = [b.copy() for b in like.node_buckets]
            self.dom_buckets = [b.copy() for b in like.dom_buckets]
            self.total_free = like.total_free
            return
        self.usable_masks = st.usable_masks if in_service_only else st.all_masks
        self.free = list(self.usable_masks)
        if used:
            for i, m in used.items():
                self.free[i] &= ~m
        self._rebuild()

    def _rebuild(self) -> None:
        """Totals and buckets from `free`, in node order (so the index depends only on which GPUs
        are free, never on the order they were taken in)."""
        st = self.static
        self.rack_free = [0] * len(st.racks)
        self.zone_free = [0] * len(st.zones)
        self.node_buckets = [{} for _ in range(st.max_node + 1)]
        self.dom_buckets = [{} for _ in range(st.max_domain + 1)]
        total = 0
        free, eligible, domains = self.free, st.eligible, st.domains
        node_rack, node_zone, rack_free, zone_free = st.node_rack, st.node_zone, self.rack_free, self.zone_free
        node_buckets, dom_buckets = self.node_buckets, self.dom_buckets
        for i in range(len(free)):
            if eligible[i]:
                f = free[i]
                c = f.bit_count()
                total += c
                rack_free[node_rack[i]] += c
                zone_free[node_zone[i]] += c
                node_buckets[c][i] = None
                doms = domains[i]
                if len(doms) == 1:
                    dom_buckets[(f & doms[0]).bit_count()][(i, 0)] = None
                else:
                    for d, dm in enumerate(doms):
                        dom_buckets[(f & dm).bit_count()][(i, d)] = None
        self.total_free = total

    def copy(self) -> FreeGpus:
        """An independent index with the same free GPUs, without `_rebuild`'s pass over every node.

        Why: a `SchedulerState` keeps one index current between cycles (each change moves the few
        nodes it touches) and hands each cycle a copy it may change. The copy's buckets are the
        same sets as a rebuilt index's; their insertion order may differ, which nothing reads
        (placement takes `min` or `sorted` of a bucket, or its size)."""
        return FreeGpus(self.cluster, like=self)

    @classmethod
    def from_running(
        cls, cluster: Cluster, running: Iterable[RunningJob], *, skip: frozenset[str] = frozenset()
    ) -> FreeGpus:
        """The free GPUs once every running job (except ids in `skip`) holds its placement."""
        st = ClusterIndex.of(cluster, frozenset({NodeState.READY}))
        used: dict[int, int] = {}
        for r in running:
            if r.job.id in skip:
                continue
            for i, m in st.held_masks(r, used):
                used[i] = used.get(i, 0) | m
        return cls(cluster, used=used)

    @classmethod
    def from_mapping(cls, cluster: Cluster, free: Mapping[str, Iterable[int]]) -> FreeGpus:
        """An index where exactly the listed GPUs (node name -> indices) are free."""
        st = ClusterIndex.of(cluster, frozenset({NodeState.READY}))
        used = {i: st.all_masks[i] & ~mask_of(free.get(name, ())) for i, name in enumerate(st.names)}
        return cls(cluster, used=used)

    def masks_of(self, placement: Placement) -> tuple[tuple[int, int], ...]:
        """(node index, GPU mask) per node of `placement`, sorted by node index."""
        return self.static.masks_of(placement)

    def as_mapping(self) -> dict[str, tuple[int, ...]]:
        return {n: indices_of(self.free[i]) for i, n in enumerate(self.names) if self.free[i]}

    # -- mutation ---------------------------------------------------------------------------------

    def _move(self, i: int, new: int) -> None:
        old = self.free[i]
        if old == new:
            return
        if self.eligible[i]:
            oc, nc = old.bit_count(), new.bit_count()
            if oc != nc:
                del self.node_buckets[oc][i]
                self.node_buckets[nc][i] = None
                delta = nc - oc
                self.total_free += delta
                self.rack_free[self.node_rack[i]] += delta
                self.zone_free[self.node_zone[i]] += delta
            for d, dm in enumerate(self.domains[i]):
                a, b = (old & dm).bit_count(), (new & dm).bit_count()
                if a != b:
                    del self.dom_buckets[a][(i, d)]
                    self.dom_buckets[b][(i, d)] = None
        self.free[i] = new

    def take(self, i: int, mask: int) -> None:
        """Mark GPUs used; they must be free (a double allocation is a bug, not a condition)."""
        if mask & ~self.free[i]:
            raise AssertionError(f"GPUs {indices_of(mask & ~self.free[i])} of {self.names[i]} are not free")
        self._move(i, self.free[i] & ~mask)

    def give(self, i: int, mask: int) -> int:
        """Mark GPUs free again; they must be used and exist. Returns the mask made free: a GPU out
        of service stays taken (its holder leaving does not make it usable)."""
        if mask & self.free[i] or mask & ~self.all_masks[i]:
            raise AssertionError(f"GPUs {indices_of(mask)} of {self.names[i]} are not held")
        freed = mask & self.usable_masks[i]
        self._move(i, self.free[i] | freed)
        return freed

    # -- matching ---------------------------------------------------------------------------------

    def match_masks(self, request: GpuRequest | None) -> tuple[bool, list[int]]:
        """(every GPU matches, per-node mask of GPUs that satisfy `request`)."""
        if request is None or request.is_any:
            return True, self.all_masks
        hit = self._match_cache.get(request)
        if hit is None:
            masks = [mask_of(g.index for g in n.gpus if request.matches(g)) if request.fits_node(n) else 0
                     for n in self.cluster.nodes]
            hit = (masks == self.all_masks, masks)
            self._match_cache[request] = hit
        return hit


class Statement:
    """A journal of take/give operations on a FreeGpus index that can be rolled back exactly."""

    __slots__ = ("_ops", "index")

    def __init__(self, index: FreeGpus):
        self.index = index
        self._ops: list[tuple[bool, int, int]] = []

    def take(self, i: int, mask: int) -> None:
        self.index.take(i, mask)
        self._ops.append((True, i, mask))

    def give(self, i: int, mask: int) -> None:
        self._ops.append((False, i, self.index.give(i, mask)))

    def mark(self) -> int:
        """A point to roll back to with `rollback_to`."""
        return len(self._ops)

    def rollback_to(self, mark: int) -> None:
        """Undo every operation recorded after `mark`, newest first."""
        for took, i, mask in reversed(self._ops[mark:]):
            if took:
                self.index.give(i, mask)
            else:
                self.index.take(i, mask)
        del self._ops[mark:]

    def rollback(self) -> None:
        self.rollback_to(0)

    def commit(self) -> None:
        self._ops.clear()
