"""Whether a gang would fit if more GPUs were free, from counts alone: `fits_with` and `Headroom`.

Why: a backfill reservation asks "does the job fit once these running jobs are gone?" for
prefixes of the releases, and a preemption plan the same for its candidates; giving the GPUs back
on the index (a journal of moves), searching a placement and rolling back for each answer is the
costly way. For a job
without a hard gang level placement fits exactly when enough GPUs are free and the cluster's rank
capacity (per node, the ranks its free GPUs can hold) reaches the replicas (`placement.fits_now`),
so adding GPUs only changes those two counts on the nodes they are on: `Headroom` keeps the
counts as GPUs are added, node mask by node mask, without touching the index.
"""

from __future__ import annotations

from corral.core.gpuset import FreeGpus
from corral.core.model import Job
from corral.core.placement import cluster_capacity, filter_replica_topology, request_for


class Headroom:
    """`fits_now(free, job)` as GPUs are added (`add`), for a job without a hard gang level.
    `free` is read, never changed, and must not change while this is in use."""

    __slots__ = ("capacity", "free", "now", "req", "total")

    def __init__(self, free: FreeGpus, job: Job) -> None:
        assert job.topology.gang is None, "a hard gang level needs a placement search"
        self.free = free
        self.req = request_for(free, job)
        self.total = free.total_free
        self.capacity = cluster_capacity(self.req)
        self.now: dict[int, int] = {}  # node -> its free GPUs with those added so far

    def add(self, i: int, mask: int) -> None:
        """Count the GPUs of `mask` on node i as free too (as `ledger.give_back` would)."""
        free = self.free
        if not free.eligible[i]:
            return  # never offered: counted by neither total
        old = self.now.get(i, free.free[i])
        new = old | (mask & free.usable_masks[i])
        if new != old:
            req = self.req
            self.now[i] = new
            self.total += new.bit_count() - old.bit_count()
            self.capacity += filter_replica_topology(req, i, new & req.match[i])
            self.capacity -= filter_replica_topology(req, i, old & req.match[i])

    def fits(self) -> bool:
        req = self.req
        return (self.total if req.all_match else 1 << 62) >= req.total and self.capacity >= req.replicas


def fits_with(free: FreeGpus, job: Job, gained: dict[int, int]) -> bool | None:
    """`fits_now` as if the GPUs of `gained` (node index -> mask) were free too, from the counts
    alone: the index is not touched. None when counts do not answer (a hard gang level)."""
    if job.topology.gang is not None:
        return None
    room = Headroom(free, job)
    for i, g in gained.items():
        room.add(i, g)
    return room.fits()
