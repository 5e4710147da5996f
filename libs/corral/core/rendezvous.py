"""Which `MASTER_PORT` a gang rendezvouses on: a port of rank 0's node no live gang holds.

Problem: every gang's rank 0 listens on `MASTER_ADDR:MASTER_PORT` (torch.distributed's TCPStore).
The port used to be a crc32 hash of the job into one 20,000-port space with no check, so two gangs
whose rank 0 shared a host could pick the same port, and the second failed to bind (or, worse,
joined the first one's store). Placement, the single writer of reservations, now chooses the port
from the master node's range, skipping the ports held by live gangs on that address (the projection
keeps them, see `corral.projection.ClusterView.ports`).

The choice is deterministic: the first free port at or after a start derived from the job and
attempt (so replaying the same log gives the same ports, and successive attempts spread out),
wrapping around inside the range.
"""

from __future__ import annotations

import zlib
from collections.abc import Container

DEFAULT_PORT_RANGE: tuple[int, int] = (29500, 49499)
"""The range of a node that registered none (agents before issue 15 and simulated nodes): the
20,000 ports the old hash used."""

AGENT_PORT_RANGE: tuple[int, int] = (29500, 30499)
"""The default of `corral agent --port-range`: one real host rarely masters 1,000 gangs at once."""


def parse_port_range(text: str) -> tuple[int, int]:
    """`LO-HI` (inclusive) as a pair; ValueError naming the mistake and the fix."""
    low, sep, high = text.strip().partition("-")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit():
        raise ValueError(f"port range {text!r}: expected LO-HI, e.g. 29500-30499")
    lo, hi = int(low), int(high)
    if not 1 <= lo <= 65535 or not 1 <= hi <= 65535:
        raise ValueError(f"port range {text!r}: ports are 1..65535")
    if hi < lo:
        raise ValueError(f"port range {text!r}: {hi} is below {lo}; give LO-HI with LO <= HI")
    return lo, hi


def choose_port(key: str, low: int, high: int, held: Container[int]) -> int | None:
    """The first port of `low..high` at or after the start `key` hashes to (wrapping) that is not
    in `held`; None when every port of the range is held."""
    if high < low:
        raise ValueError(f"port range {low}-{high}: high is below low")
    size = high - low + 1
    start = zlib.crc32(key.encode()) % size
    for offset in range(size):
        port = low + (start + offset) % size
        if port not in held:
            return port
    return None


__all__ = ["AGENT_PORT_RANGE", "DEFAULT_PORT_RANGE", "choose_port", "parse_port_range"]
