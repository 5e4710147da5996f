"""`corral up` keeps the previous run's ports when they are still free, and says which it could not
keep (another process took them between the stop and the restart)."""

from __future__ import annotations

import socket
from pathlib import Path

from corral.stack.up import Stack, StackOptions


def test_a_free_port_is_kept_and_a_taken_one_is_said_to_have_moved(tmp_path: Path) -> None:
    said: list[str] = []
    stack = Stack(StackOptions(data_dir=tmp_path), say=said.append)
    with socket.socket() as free, socket.socket() as taken:
        free.bind(("127.0.0.1", 0))
        free_port = free.getsockname()[1]
        free.close()
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        taken_port = taken.getsockname()[1]
        previous = {"metrics:quota": free_port, "metrics:placement": taken_port}
        assert stack._keep("metrics:quota", previous, reuse_address=True) == free_port
        now = stack._keep("metrics:placement", previous, reuse_address=True)
    assert now != taken_port
    assert stack.moved_ports == {"metrics:placement": (taken_port, now)}
    assert said == [f"metrics:placement: port {taken_port} of the previous run is taken by another process; "
                    f"using {now}"]
    assert stack._keep("metrics:admission", previous) == 0, "no previous port: the caller picks one"
    assert stack.moved_ports.keys() == {"metrics:placement"}
