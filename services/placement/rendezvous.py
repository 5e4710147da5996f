"""A gang's `MASTER_ADDR:MASTER_PORT`, chosen from the projection (placement's part of rendezvous).

Why: a gang spanning hosts rendezvouses at its rank 0's node, on a port no other live gang on that
host holds. Here the address is the one rank 0's node registered, and the
port the first free one of that node's range (`corral.core.rendezvous.choose_port`), free meaning
held neither by a live gang in the log (`ClusterView.ports`) nor by a gang placed earlier in the
same cycle (`taken`, not yet in the log). Pure: no I/O, the same view gives the same answer.
"""

from __future__ import annotations

from collections.abc import Mapping

from corral import core
from corral.core.rendezvous import DEFAULT_PORT_RANGE, choose_port
from corral.projection import ClusterView


class _Either:
    """Membership in `a` or `b` without copying either (the held ports may be many)."""

    def __init__(self, a: Mapping[int, object] | set[int], b: set[int]) -> None:
        self.a, self.b = a, b

    def __contains__(self, item: object) -> bool:
        return item in self.a or item in self.b


def choose_rendezvous(view: ClusterView, job_id: str, attempt: int, placement: core.Placement,
                      taken: dict[str, set[int]], fallback_address: str) -> tuple[str, int] | core.Reason:
    """(MASTER_ADDR, MASTER_PORT) for this attempt of the job placed as `placement`, recording the
    port in `taken`; a RENDEZVOUS_PORTS_EXHAUSTED reason when rank 0's node has no free port.

    `fallback_address`: for a node that registered no address (`CORRAL_MASTER_ADDR`)."""
    master = min(placement.ranks, key=lambda r: r.rank).node
    node = view.nodes.get(master)
    address = (node.address if node else None) or fallback_address
    low, high = (node.rendezvous_ports if node else None) or DEFAULT_PORT_RANGE
    extra = taken.setdefault(address, set())
    port = choose_port(f"{job_id}:{attempt}", low, high, _Either(view.ports.get(address, {}), extra))
    if port is None:
        return core.Reason(core.ReasonCode.RENDEZVOUS_PORTS_EXHAUSTED,
                           f"all {high - low + 1} rendezvous ports {low}-{high} of node {master} ({address}), "
                           "rank 0's node, are held by running gangs; the job waits for one to end "
                           "(or widen that agent's --port-range)",
                           (("node", master), ("ports", high - low + 1)))
    extra.add(port)
    return address, port


__all__ = ["choose_rendezvous"]
