"""The host's ephemeral ports, which a gang's MASTER_PORT must stay out of.

Why: a rendezvous port in Linux's default ephemeral range (32768-60999) may be the local port of
any outgoing connection on the machine, or of any listener bound to port 0, which rank 0's
TCPStore then cannot bind (EADDRINUSE), and the gang fails to start. The agents register a range
outside it (`corral.core.rendezvous.outside_ephemeral`), and `corral agent`
warns when its `--port-range` overlaps it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from corral.core.rendezvous import AGENT_PORT_RANGE, outside_ephemeral, overlap

log = logging.getLogger("corral.agent")

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int] | None:
    """The kernel's ephemeral port range, or None where it cannot be read (not Linux)."""
    try:
        low, high = (int(word) for word in path.read_text().split())
    except (OSError, ValueError):
        return None
    return (low, high) if 1 <= low <= high <= 65535 else None


def local_rendezvous_ports(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int] | None:
    """The range this host's agents register: outside its ephemeral ports; `corral agent`'s default
    where the kernel does not say; None (placement's default range, with a warning) when the
    ephemeral range leaves no room."""
    kernel = ephemeral_range(path)
    if kernel is None:
        return AGENT_PORT_RANGE
    chosen = outside_ephemeral(kernel)
    if chosen is None:
        log.warning("this host's ephemeral ports (%d-%d, net.ipv4.ip_local_port_range) leave no range of "
                    "rendezvous ports outside them: a gang's MASTER_PORT may be taken by an outgoing "
                    "connection; narrow that range or reserve ports with net.ipv4.ip_local_reserved_ports",
                    *kernel)
    return chosen


def port_range_warning(ports: tuple[int, int], kernel: tuple[int, int] | None) -> str | None:
    """What `corral agent` says when its `--port-range` shares ports with the host's ephemeral
    range (`kernel`), or None when it does not (or the kernel did not say)."""
    shared = overlap(ports, kernel) if kernel is not None else None
    if shared is None or kernel is None:
        return None
    better = outside_ephemeral(kernel)
    fix = f"give --port-range {better[0]}-{better[1]}" if better is not None else "narrow that range"
    return (f"--port-range {ports[0]}-{ports[1]}: ports {shared[0]}-{shared[1]} are in this host's ephemeral range "
            f"{kernel[0]}-{kernel[1]} (net.ipv4.ip_local_port_range), where any outgoing connection may hold a "
            f"gang's MASTER_PORT and rank 0 then cannot listen on it; {fix}, or reserve them with "
            f"`sysctl net.ipv4.ip_local_reserved_ports={shared[0]}-{shared[1]}`")
