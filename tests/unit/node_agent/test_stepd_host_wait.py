"""The stepd host waits on every hosted rank's pipe at once: a node's worth of gangs (one agent
process can serve many simulated nodes) holds fd numbers past select's 1024."""

from __future__ import annotations

import os

from corral.services.node_agent.process import stepd_host


def test_the_host_waits_on_descriptors_numbered_past_1024() -> None:
    r, w = os.pipe()
    high = 1500
    os.dup2(r, high)
    try:
        assert stepd_host.ready([high], 0.0) == []
        os.write(w, b"x")
        assert stepd_host.ready([high], 1.0) == [high]
    finally:
        for fd in (r, w, high):
            os.close(fd)
