"""deploy/nats.conf and deploy/nats/nats.conf (docker-compose's NATS cluster) admit no anonymous
client, and their identities (deploy/nats/auth.conf, which both include) are the ones
`corral.bus.auth` defines (issue 12).

Before, it listened on 0.0.0.0 with no authorization: anyone reaching port 4222 could publish a
GangReserved and run a command as root on a node. The test starts the real nats-server with a copy
of the file (only the listen address and store directory changed, to a free loopback port and a
temporary directory) and the passwords in the environment, as docker-compose passes them.

Regenerate deploy/nats/auth.conf after changing `corral.bus.auth` or the nodes:
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

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
CONF = DEPLOY / "nats.conf"
AUTH = DEPLOY / "nats" / "auth.conf"
#: docker-compose's agents: one `corral agent` process per node, each with its own identity
#: (`agent-<its durable>`) and consumer; both take their password from CORRAL_NATS_AGENTS_PASSWORD.
NODES = ("node-0", "node-1")
AUTH_HEADER = """# Who may connect to Corral's NATS: generated from corral.bus.auth for namespace `corral` and the
# nodes of docker-compose.yml (`python -m tests.integration.test_deploy_nats_conf` rewrites it; a
# test fails when it drifts). `svc-services`: all services and the relay (the only publishers of
# corral.events.>); `agent-node-agent-<node>`: the agent of one node (its reports, heartbeats and
# ranks' output, its own two consumers); `admin`: its own user and admin subjects (submit as a
# person; queues, drains, any job's cancel as the admin), reading streams and logs. No identity
# may publish a bare corral.inbox.<Type>. Passwords come from the environment; with one unset,
# nats-server does not start. More nodes: add them to NODES there.
"""


def agent_user(node: str) -> str:
    from corral.services.node_agent.service import durable_name

    return f"agent-{durable_name([node])}"


def passwords_env() -> dict[str, str]:
    """Each user's password variable."""
    return {"svc-services": "CORRAL_NATS_SERVICES_PASSWORD", "admin": "CORRAL_NATS_ADMIN_PASSWORD",
            **{agent_user(n): "CORRAL_NATS_AGENTS_PASSWORD" for n in NODES}}


def expected_authorization() -> str:
    """The block `corral.bus.auth` generates for docker-compose, passwords from the environment."""
    from corral.services.node_agent.service import durable_name

    ids = [auth.service("corral", "services", "svc-services"),
           *(auth.agent("corral", [n], durable_name([n]), agent_user(n)) for n in NODES),
           auth.submitter("corral", "admin", "admin", admin=True)]
    block = auth.nats_authorization(ids)
    for user, env in passwords_env().items():
        block = block.replace(f'password: "{user}"', f"password: ${env}")
    return AUTH_HEADER + block


def test_the_authorization_block_is_what_corral_bus_auth_generates() -> None:
    assert AUTH.read_text() == expected_authorization(), (
        "deploy/nats/auth.conf's identities differ from corral.bus.auth: regenerate them with "
        "`python -m tests.integration.test_deploy_nats_conf`")
    for conf in (CONF, DEPLOY / "nats" / "nats.conf"):
        assert "users = [" not in conf.read_text() and "/auth.conf" in conf.read_text(), conf


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
    text, https = re.subn(r"(?m)^http:.*$", "", text)
    text, includes = re.subn(r"(?m)^include .*$", "include ./auth.conf", text)  # relative to the config
    (tmp / "auth.conf").write_text(AUTH.read_text())
    assert (listens, stores, https, includes) == (1, 1, 1, 1), \
        "deploy/nats.conf: expected one listen, store_dir, http and include line"
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
    # Hex (as deploy/README.md makes them): nats-server parses an environment value as a config
    # value, and a token_urlsafe password starting with '-' made it refuse to start (a flaky test).
    by_env = {env: secrets.token_hex(12) for env in set(passwords_env().values())}
    passwords = {user: by_env[env] for user, env in passwords_env().items()}
    env = {**os.environ, **by_env}
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
    for user in (agent_user(NODES[0]), "admin"):
        async with await Bus.connect(deploy_nats.url(user), "corral") as bus:
            with pytest.raises((TimeoutError, nats.errors.Error)):
                await bus.publish("corral.events.GangReserved", b"{}", f"forged-{user}", timeout=1.0)
            # no bare inbox subject, no other sender's: the admin acts only under its own name
            for subject in ("corral.inbox.JobSubmitted", "corral.inbox.user.bob.JobSubmitted",
                            "corral.inbox.node.node-9.WorkerExited"):
                with pytest.raises((TimeoutError, nats.errors.Error)):
                    await bus.publish(subject, b"{}", f"forged-{user}-{subject}", timeout=1.0)
    async with await Bus.connect(deploy_nats.url("admin"), "corral") as admin:
        for subject in ("corral.inbox.admin.admin.NodeDrained", "corral.inbox.user.admin.JobSubmitted"):
            taken = await admin.publish(subject, b"{}", f"by-admin-{subject}", timeout=5.0)
            assert taken.stream == "CORRAL_INBOX"


def test_no_password_in_the_environment_no_server(tmp_path: Path) -> None:
    """docker-compose refuses to start without the passwords; nats-server too (no default)."""
    env = {k: v for k, v in os.environ.items() if k not in passwords_env().values()}
    proc, _, log = _start(tmp_path, env)
    try:
        assert proc.wait(10) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert "CORRAL_NATS_" in log.read_text(), log.read_text()


if __name__ == "__main__":
    AUTH.write_text(expected_authorization())
    print(f"rewrote {AUTH}")
