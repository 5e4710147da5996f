"""FreeGpus: an index of free GPUs per node, NVLink domain, rack and zone, and a Statement journal.

Placement runs thousands of times per cycle, so free GPUs are bitmasks per node and nodes are
bucketed by free count (dict buckets keep insertion order, so picks are deterministic without
sorting). Rack/zone/cluster free totals answer "can it fit at all?" in O(1) before any scan.
A `Statement` records allocations and releases so that a tentative gang allocation or a
preemption simulation can be rolled back exactly (Volcano's Statement, without the I/O).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from corral.core.model import Cluster, GpuRequest, NodeState, RunningJob


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


class FreeGpus:
    """Free GPUs of a cluster as bitmasks, with buckets by free count for fast best-fit.

    Only nodes in state READY are eligible for new work (`eligible`); GPUs of other nodes are
    tracked but never offered. Node order is the cluster's node order.
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
        "total_free",
        "zone_free",
        "zone_nodes",
        "zones",
    )

    def __init__(self, cluster: Cluster, eligible_states: frozenset[NodeState] = frozenset({NodeState.READY})):
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
        self.domains = [tuple(mask_of(ix) for ix in n.domains().values()) for n in nodes]
        self.single_domain = all(len(d) <= 1 for d in self.domains)
        self.max_node = max((len(n.gpus) for n in nodes), default=0)
        self.max_domain = max((m.bit_count() for d in self.domains for m in d), default=0)
        self.rack_nodes: list[list[int]] = [[] for _ in self.racks]
        self.zone_nodes: list[list[int]] = [[] for _ in self.zones]
        for i in range(len(nodes)):
            if self.eligible[i]:
                self.rack_nodes[self.node_rack[i]].append(i)
                self.zone_nodes[self.node_zone[i]].append(i)
        self.free = [0] * len(nodes)
        self.rack_free = [0] * len(self.racks)
        self.zone_free = [0] * len(self.zones)
        self.total_free = 0
        self.node_buckets: list[dict[int, None]] = [{} for _ in range(self.max_node + 1)]
        self.dom_buckets: list[dict[tuple[int, int], None]] = [{} for _ in range(self.max_domain + 1)]
        self._match_cache: dict[GpuRequest, tuple[bool, list[int]]] = {}
        for i in range(len(nodes)):
            self.free[i] = self.all_masks[i]
            if self.eligible[i]:
                c = self.all_masks[i].bit_count()
                self.total_free += c
                self.rack_free[self.node_rack[i]] += c
                self.zone_free[self.node_zone[i]] += c
                self.node_buckets[c][i] = None
                for d, dm in enumerate(self.domains[i]):
                    self.dom_buckets[dm.bit_count()][(i, d)] = None

    @classmethod
    def from_running(
        cls, cluster: Cluster, running: Iterable[RunningJob], *, skip: frozenset[str] = frozenset()
    ) -> FreeGpus:
        """The free GPUs once every running job (except ids in `skip`) holds its placement."""
        fi = cls(cluster)
        for r in running:
            if r.job.id in skip:
                continue
            for rank in r.placement.ranks:
                i = fi.index_of.get(rank.node)
                if i is None:
                    raise ValueError(
                        f"running job {r.job.id!r} holds GPUs on node {rank.node!r}, which is not in the "
                        "cluster; keep lost nodes in Cluster.nodes with state 'lost' until their jobs end"
                    )
                m = mask_of(rank.gpus)
                if m & ~fi.all_masks[i]:
                    raise ValueError(
                        f"running job {r.job.id!r} holds GPUs {indices_of(m & ~fi.all_masks[i])} that node "
                        f"{rank.node!r} does not have"
                    )
                if m & ~fi.free[i]:
                    raise ValueError(
                        f"running job {r.job.id!r} holds GPUs {indices_of(m & ~fi.free[i])} of node "
                        f"{rank.node!r} that another running job also holds; a GPU has one holder"
                    )
                fi.take(i, m)
        fi.canonicalize()
        return fi

    @classmethod
    def from_mapping(cls, cluster: Cluster, free: Mapping[str, Iterable[int]]) -> FreeGpus:
        """An index where exactly the listed GPUs (node name -> indices) are free."""
        fi = cls(cluster)
        for i, name in enumerate(fi.names):
            keep = mask_of(free.get(name, ())) & fi.all_masks[i]
            fi.take(i, fi.all_masks[i] & ~keep)
        fi.canonicalize()
        return fi

    def canonicalize(self) -> None:
        """Reorder the buckets by node order, so that the index depends only on which GPUs are
        free and not on the order they were taken in (the snapshot's list order is irrelevant)."""
        for b in self.node_buckets:
            b.clear()
        for db in self.dom_buckets:
            db.clear()
        for i in range(len(self.names)):
            if self.eligible[i]:
                f = self.free[i]
                self.node_buckets[f.bit_count()][i] = None
                for d, dm in enumerate(self.domains[i]):
                    self.dom_buckets[(f & dm).bit_count()][(i, d)] = None

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

    def give(self, i: int, mask: int) -> None:
        """Mark GPUs free again; they must be used and exist."""
        if mask & self.free[i] or mask & ~self.all_masks[i]:
            raise AssertionError(f"GPUs {indices_of(mask)} of {self.names[i]} are not held")
        self._move(i, self.free[i] | mask)

    # -- matching ---------------------------------------------------------------------------------

    def match_masks(self, request: GpuRequest | None) -> tuple[bool, list[int]]:
        """(every GPU matches, per-node mask of GPUs that satisfy `request`)."""
        if request is None or (request.model is None and request.min_memory_gib is None):
            return True, self.all_masks
        hit = self._match_cache.get(request)
        if hit is None:
            masks = [mask_of(g.index for g in n.gpus if request.matches(g)) for n in self.cluster.nodes]
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
        self.index.give(i, mask)
        self._ops.append((False, i, mask))

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
