"""deploy/nats.conf (docker-compose's NATS) admits no anonymous client, and its identities are the
ones `corral.bus.auth` defines (issue 12).

Before, it listened on 0.0.0.0 with no authorization: anyone reaching port 4222 could publish a
GangReserved and run a command as root on a node. The test starts the real nats-server with a copy
of the file (only the listen address and store directory changed, to a free loopback port and a
temporary directory) and the passwords in the environment, as docker-compose passes them.

Regenerate the file's authorization block after changing `corral.bus.auth`:
`python -m tests.integration.test_deploy_nats_conf`.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest

from corral.bus import Bus, auth
from corral.stack.servers import free_port, nats_server_binary

CONF = Path(__file__).resolve().parents[2] / "deploy" / "nats.conf"
NODES = tuple(f"node-{i}" for i in range(4))  # docker-compose's node-agents: --cluster 4x8:H100
PASSWORDS = {"svc-services": "CORRAL_NATS_SERVICES_PASSWORD", "agents": "CORRAL_NATS_AGENTS_PASSWORD",
             "admin": "CORRAL_NATS_ADMIN_PASSWORD"}


def expected_authorization() -> str:
    """The block `corral.bus.auth` generates for docker-compose, passwords from the environment."""
    from corral.services.node_agent.service import durable_name

    ids = [auth.service("corral", "services", "svc-services"),
           auth.agent("corral", NODES, durable_name(NODES), "agents", name="agents"),
           auth.submitter("corral", "admin", "admin", admin=True)]
    block = auth.nats_authorization(ids)
    for user, env in PASSWORDS.items():
        block = block.replace(f'password: "{user}"', f"password: ${env}")
    return block


def test_the_authorization_block_is_what_corral_bus_auth_generates() -> None:
    text = CONF.read_text()
    assert "authorization {" in text
    actual = text[text.index("authorization {"):]
    assert actual == expected_authorization(), (
        "deploy/nats.conf's identities differ from corral.bus.auth: regenerate them with "
        "`python -m tests.integration.test_deploy_nats_conf`")


@dataclass
class DeployNats:
    port: int
    passwords: dict[str, str]

    def url(self, user: str | None = None) -> str:
        who = f"{user}:{self.passwords[user]}@" if user else ""
        return f"nats://{who}127.0.0.1:{self.port}"


def _start(tmp: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], int, Path]:
    port = free_port()
    text = CONF.read_text()
    text, listens = re.subn(r"(?m)^listen:.*$", f"listen: 127.0.0.1:{port}", text)
    text, stores = re.subn(r"(?m)^(\s*)store_dir:.*$", rf'\1store_dir: "{tmp / "js"}"', text)
    assert (listens, stores) == (1, 1), "deploy/nats.conf: expected one listen and one store_dir line"
    conf = tmp / "nats.conf"
    conf.write_text(text)
    log = tmp / "nats.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([nats_server_binary(), "-c", str(conf)], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    return proc, port, log


@pytest.fixture(scope="module")
def deploy_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DeployNats]:
    tmp = tmp_path_factory.mktemp("deploy-nats")
    passwords = {user: secrets.token_urlsafe(12) for user in PASSWORDS}
    env = {**os.environ, **{PASSWORDS[user]: pw for user, pw in passwords.items()}}
    proc, port, log = _start(tmp, env)
    try:
        import socket
        import time

        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
        yield DeployNats(port, passwords)
    finally:
        proc.terminate()
        proc.wait(10)


async def test_an_unauthenticated_client_is_refused(deploy_nats: DeployNats) -> None:
    for url in (deploy_nats.url(), f"nats://admin:wrong@127.0.0.1:{deploy_nats.port}"):
        with pytest.raises(nats.errors.Error):  # authorization violation / no servers
            nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2)
            await nc.close()


async def test_each_identity_connects_and_only_services_publish_events(deploy_nats: DeployNats) -> None:
    async with await Bus.connect(deploy_nats.url("svc-services"), "corral") as services:
        await services.ensure_streams()
        assert (await services.publish("corral.events.JobSubmitted", b"{}", "e1")).sequence == 1
    for user in ("agents", "admin"):
        async with await Bus.connect(deploy_nats.url(user), "corral") as bus:
            with pytest.raises((TimeoutError, nats.errors.Error)):
                await bus.publish("corral.events.GangReserved", b"{}", f"forged-{user}", timeout=1.0)


def test_no_password_in_the_environment_no_server(tmp_path: Path) -> None:
    """docker-compose refuses to start without the passwords; nats-server too (no default)."""
    env = {k: v for k, v in os.environ.items() if k not in PASSWORDS.values()}
    proc, _, log = _start(tmp_path, env)
    try:
        assert proc.wait(10) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert "CORRAL_NATS_" in log.read_text(), log.read_text()


if __name__ == "__main__":
    text = CONF.read_text()
    head = text[:text.index("authorization {")] if "authorization {" in text else text
    CONF.write_text(head + expected_authorization())
    print(f"rewrote the authorization block of {CONF}")
