"""A gang's MASTER_PORT is never one the kernel may hand out for other sockets.

Why: an agent that registers no rendezvous range gets ports of 29500-49499 for its gangs, of
which 32768-49499 is in Linux's default ephemeral range (32768-60999): the local port of any
outgoing connection on the machine, or of any listener bound to port 0 (the tests' own nats-server
and Postgres). Rank 0's TCPStore cannot bind such a port (EADDRINUSE, with or without
SO_REUSEADDR: checked below), and the gang fails to start. `corral up`'s agents (one host, every
node of the cluster file) register a range below it.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from corral.core.rendezvous import AGENT_PORT_RANGE, DEFAULT_PORT_RANGE, outside_ephemeral, overlap
from corral.services.node_agent.__main__ import options, parser
from corral.services.node_agent.host.ephemeral_ports import EPHEMERAL_RANGE_FILE, ephemeral_range, port_range_warning


def test_a_listener_cannot_take_a_port_an_outgoing_connection_holds() -> None:
    """The fact the fix rests on (Linux): SO_REUSEADDR does not help rank 0."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname()) as client:
            held = client.getsockname()[1]
            with socket.socket() as rank0:
                rank0.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                with pytest.raises(OSError):
                    rank0.bind(("0.0.0.0", held))


def test_overlap() -> None:
    assert overlap(DEFAULT_PORT_RANGE, (32768, 60999)) == (32768, 49499)
    assert overlap(AGENT_PORT_RANGE, (32768, 60999)) is None
    assert overlap((29500, 30499), (1024, 65535)) == (29500, 30499)
    assert overlap((100, 200), (200, 300)) == (200, 200)


@pytest.mark.parametrize(("ephemeral", "expected"), [
    ((32768, 60999), (29500, 32767)),     # Linux's default: 3,268 ports below it
    ((49152, 65535), (29500, 49151)),     # the IANA range (BSD, Windows): torch's 29500 upward, capped
    ((30000, 60999), (61000, 65535)),     # too little room below: above it
    ((1024, 65535), None),                # no room anywhere: the caller says so
])
def test_outside_ephemeral(ephemeral: tuple[int, int], expected: tuple[int, int] | None) -> None:
    chosen = outside_ephemeral(ephemeral)
    assert chosen == expected
    if chosen is not None:
        assert overlap(chosen, ephemeral) is None and chosen[1] - chosen[0] + 1 >= 1000


def test_ephemeral_range_is_read_from_the_kernel(tmp_path: Path) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text("32768\t60999\n")
    assert ephemeral_range(path) == (32768, 60999)
    path.write_text("garbage\n")
    assert ephemeral_range(path) is None
    assert ephemeral_range(tmp_path / "missing") is None


def test_corral_ups_agents_register_ports_outside_this_machines_ephemeral_range(tmp_path: Path) -> None:
    (tmp_path / "cluster").write_text("2x8:H100\n")
    args = parser().parse_args(["--inventory", str(tmp_path / "cluster"), "--state-dir", str(tmp_path),
                                "--port-range", "auto"])
    ports = options(args, {}).rendezvous_ports
    assert ports is not None, "no range registered: placement falls back to 29500-49499"
    kernel = ephemeral_range(EPHEMERAL_RANGE_FILE)
    if kernel is not None:
        assert overlap(ports, kernel) is None, (ports, kernel)


def test_corral_agent_warns_when_its_port_range_meets_the_ephemeral_ports() -> None:
    text = port_range_warning((29500, 30499), (1024, 65535))
    assert text is not None and "ports 29500-30499 are in this host's ephemeral range 1024-65535" in text
    assert "ip_local_reserved_ports=29500-30499" in text and "narrow that range" in text
    text = port_range_warning((40000, 41000), (32768, 60999))
    assert text is not None and "give --port-range 29500-32767" in text
    assert port_range_warning((29500, 30499), (32768, 60999)) is None
    assert port_range_warning((29500, 30499), None) is None
