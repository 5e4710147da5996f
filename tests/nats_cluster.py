"""A 3-node JetStream cluster of real nats-server processes on loopback, for tests.

Why: "one NATS node lost, nothing lost" can only be shown with a real cluster: R3 streams whose
leader dies, clients that reconnect to the surviving servers. Each server listens on 127.0.0.1 on
free ports (client and route), shares the test's authorization (a superuser), and names the other
two as routes; `url` lists all three for `CORRAL_NATS_URL` (see `corral.bus.urls`). The routes
use TLS as deployed (deploy/nats/nats.conf): a CA and certificate from `corral.stack.tls`, both
sides verified; clients stay on plain TCP here.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import nats

from corral.bus.urls import server_urls
from corral.stack import tls
from corral.stack.servers import NatsServer, ServerStartError, free_port

HOST = "127.0.0.1"


def cluster_block(name: str, server_name: str, route_port: int, routes: list[int],
                  route_tls: tls.TlsFiles | None = None) -> str:
    others = ", ".join(f'"nats-route://{HOST}:{port}"' for port in routes)
    return (f'server_name: "{server_name}"\n'
            f'cluster {{\n  name: "{name}"\n  listen: "{HOST}:{route_port}"\n  routes: [{others}]\n'
            + (route_tls.route_block() if route_tls else "") + "}\n")


@dataclass
class NatsCluster:
    """Three nats-servers routed to each other; `start()`, `kill(name)`, `stop()`."""

    authorization: str
    user: str
    password: str
    size: int = 3
    servers: dict[str, NatsServer] = field(default_factory=dict)
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="corral-test-natscluster-")))
    #: TLS on the routes between the servers (False: plain TCP, as before deploy/nats had it).
    route_tls: bool = True

    def start(self, attempts: int = 3) -> NatsCluster:
        """Start the servers; ports taken by another process between being picked and bound (a
        busy machine) are picked again, the servers started so far stopped first."""
        for attempt in range(attempts):
            try:
                return self._start()
            except ServerStartError as exc:
                if "address already in use" not in str(exc) or attempt == attempts - 1:
                    raise
                for server in self.servers.values():
                    server.stop()
                    shutil.rmtree(server.data_dir, ignore_errors=True)
                self.servers.clear()
        return self

    def _start(self) -> NatsCluster:
        routes = [free_port(HOST) for _ in range(self.size)]
        files = tls.generate(self.root / "tls", [HOST, "localhost"]) if self.route_tls else None
        for i in range(self.size):
            name = f"n{i + 1}"
            self.servers[name] = NatsServer(
                self.root / name, host=HOST, port=free_port(HOST), authorization=self.authorization,
                cluster=cluster_block("corral-test", name, routes[i], [p for j, p in enumerate(routes) if j != i],
                                      files))
        for server in self.servers.values():
            server.start()
        return self

    @property
    def url(self) -> str:
        return ",".join(f"nats://{self.user}:{self.password}@{s.host}:{s.port}" for s in self.servers.values())

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Until JetStream answers (its meta leader elected) on a connection to the cluster."""
        nc = await nats.connect(server_urls(self.url), max_reconnect_attempts=-1)
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while True:
                try:
                    await nc.jetstream().account_info()
                    return
                except Exception:
                    if loop.time() > deadline:
                        raise
                    await asyncio.sleep(0.2)
        finally:
            await nc.close()

    def logs(self) -> dict[str, Path]:
        """Each server's log file by name (`nats-server n1`): gone after `stop()`."""
        return {f"nats-server {name}": server.data_dir / "nats.log" for name, server in self.servers.items()}

    def kill(self, name: str) -> None:
        """SIGKILL one server: a host lost, its store unflushed."""
        proc = self.servers[name].proc
        assert proc is not None
        proc.kill()
        proc.wait(5)

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()
        shutil.rmtree(self.root, ignore_errors=True)
