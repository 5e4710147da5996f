"""Which `MASTER_PORT` a gang rendezvouses on: a port of rank 0's node no live gang holds.

Why: every gang's rank 0 listens on `MASTER_ADDR:MASTER_PORT` (torch.distributed's TCPStore). Two
gangs whose rank 0 share a host must not pick the same port, or the second fails to bind (or,
worse, joins the first one's store). Placement, the single writer of reservations, chooses the port
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
"""The range of a node that registers none (an agent that sends no range, and simulated nodes):
20,000 ports from 29500."""

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


def overlap(ports: tuple[int, int], other: tuple[int, int]) -> tuple[int, int] | None:
    """The ports two inclusive ranges share, or None."""
    low, high = max(ports[0], other[0]), min(ports[1], other[1])
    return (low, high) if low <= high else None


#: The fewest ports a range chosen by `outside_ephemeral` holds (gangs mastered on one host at once).
MIN_RANGE = 1000


def outside_ephemeral(ephemeral: tuple[int, int]) -> tuple[int, int] | None:
    """A rendezvous range for a host whose kernel hands out `ephemeral` ports (Linux:
    net.ipv4.ip_local_port_range) that shares no port with it, or None when no room is left.

    A port of the ephemeral range may be the local port of any outgoing connection
    on the host, or of any listener bound to port 0, and rank 0 cannot bind it then (EADDRINUSE,
    whatever SO_REUSEADDR says). From torch's 29500 up to the ephemeral range (at most as many
    ports as `DEFAULT_PORT_RANGE`), else above it to 65535, when either holds `MIN_RANGE` ports."""
    start = DEFAULT_PORT_RANGE[0]
    size = DEFAULT_PORT_RANGE[1] - DEFAULT_PORT_RANGE[0] + 1
    below_end = min(ephemeral[0] - 1, start + size - 1)
    if ephemeral[0] > start and below_end - start + 1 >= MIN_RANGE:
        return start, below_end
    above = max(ephemeral[1] + 1, start)
    if 65535 - above + 1 >= MIN_RANGE:
        return above, min(65535, above + size - 1)
    return None


__all__ = ["AGENT_PORT_RANGE", "DEFAULT_PORT_RANGE", "MIN_RANGE", "choose_port", "outside_ephemeral", "overlap",
           "parse_port_range"]
