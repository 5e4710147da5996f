"""Routes between NATS servers over TLS, both sides verified (deploy/nats/nats.conf).

Without TLS the cluster's route port carries every message (and the JetStream replication) in
clear, and any process that reaches it can join the cluster as a server. With the
`cluster { tls {...}
}` block of `corral.stack.tls.TlsFiles.route_block` (as deploy/nats/nats.conf has it), two servers
with certificates of one CA form a JetStream cluster, while a server with another CA's certificate,
or with no TLS at all, is refused by the servers it dials.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.bus.auth import nats_authorization, superuser
from corral.stack import tls
from corral.stack.servers import NatsServer, free_port
from tests.nats_cluster import HOST, NatsCluster, cluster_block


@pytest.fixture
def pair() -> Iterator[NatsCluster]:
    password = secrets.token_urlsafe(12)
    cluster = NatsCluster(nats_authorization([superuser("t", password)]), "t", password, size=2)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def _route_port(server: NatsServer) -> int:
    conf = (server.data_dir / "nats.conf").read_text()
    found = re.search(r'cluster \{\n  name: "[^"]*"\n  listen: "[^"]*:(\d+)"', conf)
    assert found is not None
    return int(found.group(1))


def _log(server: NatsServer) -> str:
    return (server.data_dir / "nats.log").read_text(errors="replace")


async def test_servers_of_one_ca_route_over_tls_and_others_are_refused(pair: NatsCluster, tmp_path: Path) -> None:
    await pair.wait_ready(timeout=20)  # a JetStream meta leader: the two servers routed to each other
    n1 = pair.servers["n1"]
    assert "verify: true" in (n1.data_dir / "nats.conf").read_text()
    port = _route_port(n1)
    other_ca = tls.generate(tmp_path / "other-ca", [HOST])
    intruders = {name: NatsServer(tmp_path / name, host=HOST, authorization=pair.authorization,
                                  cluster=cluster_block("corral-test", name, free_port(HOST), [port], files))
                 for name, files in (("other-ca", other_ca), ("plain", None))}
    try:
        for server in intruders.values():
            server.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            refused = _log(n1).count("TLS route handshake error")
            if refused >= 2 and "TLS Handshake Failure" in _log(intruders["other-ca"]):
                break
            time.sleep(0.2)
        text = _log(n1)
        assert "certificate signed by unknown authority" in _log(intruders["other-ca"]) \
            or "bad certificate" in text, text[-2000:]
        assert "Remote: other-ca" not in text and "Remote: plain" not in text, "an intruder routed:\n" + text[-2000:]
        assert "Route connection created" in text and "Remote: n2" in text, text[-2000:]
    finally:
        for server in intruders.values():
            server.stop()
