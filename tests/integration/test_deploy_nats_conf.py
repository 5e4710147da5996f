"""docker-compose's NATS (deploy/nats.conf, deploy/nats/nats.conf, both including
deploy/nats/auth.conf) admits only the identities `corral credentials` generates, the ones
`corral up` and the Kubernetes Secrets have: the services', one per node's agent (its node's
reports only), the admin's (its own user and admin subjects), the gateway's and each person's.

The test runs the compose file's own `nats-identities` command (paths moved to a temporary
directory), lays its files out as the compose mounts do (`export/nats` at `nats-auth/` beside the
config's directory; each process's credentials from its own part of `export/`), and starts the real
nats-server with a copy of deploy/nats.conf (only the listen address and store directory changed).
People are added and removed with `corral credentials person` and a SIGHUP, as deploy/README.md
says, with no restart.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml

from corral.bus import Bus
from corral.stack.servers import free_port, nats_server_binary
from tests.nats_refusals import refused

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CONF = DEPLOY / "nats.conf"
COMPOSE = ROOT / "docker-compose.yml"
IDENTITIES = "/var/lib/corral-identities"  # where nats-identities keeps them (the volume `identities`)
NODES = ("node-0", "node-1")
#: nats-identities' command, from the compose file (`corral credentials agent NODE... --dir --export`).
SERVICES = yaml.safe_load(COMPOSE.read_text())["services"]


def corral(argv: list[str], tmp: Path) -> str:
    """Run a `corral` command of the compose file or deploy/README.md, its paths moved under `tmp`."""
    moved = [a.replace(IDENTITIES, str(tmp / "identities")) for a in argv]
    assert moved[0] == "corral", moved
    done = subprocess.run([sys.executable, "-c", "from corral.cli.main import main; main()", *moved[1:]],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{shlex.join(moved)}: {done.stderr}"
    return done.stdout


def person_argv(*args: str) -> list[str]:
    """deploy/README.md's command for people: `corral credentials person ... --dir --export`."""
    return ["corral", "credentials", "person", *args, "--dir", IDENTITIES, "--export", f"{IDENTITIES}/export"]


@dataclass
class ComposeNats:
    tmp: Path
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def mounted(self, subpath: str) -> Path:
        """A file as the compose file mounts it: `export/<subpath>` of the volume."""
        return self.tmp / "identities" / "export" / subpath

    def credentials(self, user: str) -> Path:
        return self.tmp / "identities" / "credentials" / f"{user}.json"

    def reload(self) -> None:
        """`docker compose kill -s HUP nats-1 nats-2 nats-3`: re-read the authorization."""
        self.proc.send_signal(signal.SIGHUP)  # re-read asynchronously: the checks wait for its effect


def _start(tmp: Path) -> tuple[subprocess.Popen[bytes], int, Path]:
    port = free_port()
    text = CONF.read_text()
    text, listens = re.subn(r"(?m)^listen:.*$", f"listen: 127.0.0.1:{port}", text)
    text, stores = re.subn(r"(?m)^(\s*)store_dir:.*$", rf'\1store_dir: "{tmp / "js"}"', text)
    text, https = re.subn(r"(?m)^http:.*$", "", text)
    assert (listens, stores, https) == (1, 1, 1), "deploy/nats.conf: expected one listen, store_dir and http line"
    etc = tmp / "etc"
    (etc / "nats").mkdir(parents=True)
    shutil.copy(DEPLOY / "nats" / "auth.conf", etc / "nats" / "auth.conf")
    # the volume's export/nats at nats-auth/, beside the directory holding auth.conf (as mounted)
    (etc / "nats-auth").symlink_to(tmp / "identities" / "export" / "nats")
    conf = etc / "nats.conf"
    conf.write_text(text)
    log = tmp / "nats.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_NATS_")}
    with log.open("wb") as out:
        proc = subprocess.Popen([nats_server_binary(), "-c", str(conf)], env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port, log
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)


@pytest.fixture(scope="module")
def compose_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeNats]:
    tmp = tmp_path_factory.mktemp("compose-nats")
    corral(SERVICES["nats-identities"]["command"], tmp)
    proc, port, log = _start(tmp)
    try:
        yield ComposeNats(tmp, port, proc, log)
    finally:
        proc.terminate()
        proc.wait(10)


async def _connect(url: str, credentials: Path) -> Bus:
    return await Bus.connect(url, "corral", credentials=str(credentials))


async def _refused(bus: Bus, subject: str) -> None:
    assert await refused(bus, subject, bus.publish(subject, b"{}", f"forged-{subject}", timeout=1.0)), subject


def _publish_allows(auth_conf: str) -> dict[str, list[str]]:
    users = {}
    for line in auth_conf.splitlines():
        user = re.search(r'\{user: "([^"]+)"', line)
        allow = re.search(r"publish: \{allow: \[([^\]]*)\]", line)
        if user:
            users[user.group(1)] = re.findall(r'"([^"]+)"', allow.group(1)) if allow else []
    return users


def test_compose_generates_every_identity_and_none_publishes_everything(compose_nats: ComposeNats) -> None:
    allows = _publish_allows(compose_nats.mounted("nats/auth.conf").read_text())
    agents = {f"agent-node-agent-{n}" for n in NODES}
    assert {"svc-services", "admin", "gateway", *agents} <= set(allows), allows
    bare_inbox = re.compile(r"^corral\.inbox\.[A-Za-z*>]+$")
    for user, subjects in allows.items():
        assert ">" not in subjects and "corral.>" not in subjects and "corral.inbox.>" not in subjects, user
        assert not [s for s in subjects if bare_inbox.match(s)], (user, subjects)
    assert all(not s.startswith("corral.inbox.user.") or s.startswith("corral.inbox.user.admin.")
               for s in allows["admin"]), "the admin submits under its own name only"
    for part in ("nats/auth.conf", "services/credentials.json",
                 *(f"agents/{n}/credentials.json" for n in NODES)):
        assert compose_nats.mounted(part).stat().st_mode & 0o077 == 0, part


async def test_an_unauthenticated_client_is_refused(compose_nats: ComposeNats) -> None:
    admin = json.loads(compose_nats.credentials("admin").read_text())
    for url in (compose_nats.url(), f"nats://admin:wrong@127.0.0.1:{compose_nats.port}",
                f"nats://{admin['user']}:{admin['password']}x@127.0.0.1:{compose_nats.port}"):
        with pytest.raises(nats.errors.Error):  # authorization violation / no servers
            nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2)
            await nc.close()


async def test_each_process_acts_only_under_its_own_name(compose_nats: ComposeNats) -> None:
    url = compose_nats.url()
    async with await _connect(url, compose_nats.mounted("services/credentials.json")) as services:
        await services.ensure_streams()
        assert (await services.publish("corral.events.JobSubmitted", b"{}", "e1")).sequence >= 1
    async with await _connect(url, compose_nats.mounted("agents/node-0/credentials.json")) as agent:
        taken = await agent.publish("corral.inbox.node.node-0.WorkerExited", b"{}", "own-report", timeout=5.0)
        assert taken.stream == "CORRAL_INBOX"
        for subject in ("corral.events.GangReserved", "corral.inbox.node.node-1.WorkerExited",
                        "corral.inbox.WorkerExited", "corral.inbox.user.admin.JobSubmitted"):
            await _refused(agent, subject)
    async with await _connect(url, compose_nats.credentials("admin")) as admin:
        for subject in ("corral.inbox.admin.admin.NodeDrained", "corral.inbox.user.admin.JobSubmitted"):
            assert (await admin.publish(subject, b"{}", f"by-admin-{subject}", timeout=5.0)).stream == "CORRAL_INBOX"
        for subject in ("corral.events.GangReserved", "corral.inbox.JobSubmitted", "corral.inbox.user.bob.JobSubmitted",
                        "corral.inbox.node.node-0.WorkerExited", "corral.inbox.admin.other.NodeDrained"):
            await _refused(admin, subject)


async def _connects(url: str, credentials: Path) -> bool:
    identity: dict[str, Any] = json.loads(credentials.read_text())
    try:
        nc = await nats.connect(url, user=identity["user"], password=identity["password"], allow_reconnect=False,
                                max_reconnect_attempts=0, connect_timeout=2)
    except (nats.errors.Error, OSError):  # refused: an authorization violation, or the socket closed on it
        return False
    await nc.close()
    return True


async def _until(check: Any, wanted: bool) -> bool:
    deadline = time.monotonic() + 10
    while (got := await check()) != wanted and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return bool(got)


async def test_people_are_added_and_removed_without_a_restart(compose_nats: ComposeNats) -> None:
    url, tmp = compose_nats.url(), compose_nats.tmp
    async with await _connect(url, compose_nats.mounted("services/credentials.json")) as services:
        await services.ensure_streams()
    corral(person_argv("alice"), tmp)
    corral(person_argv("ci", "--pipeline"), tmp)
    compose_nats.reload()
    alice_file = compose_nats.credentials("alice")
    assert await _until(lambda: _connects(url, alice_file), True), compose_nats.log.read_text()[-2000:]
    async with await _connect(url, alice_file) as alice:
        assert (await alice.publish("corral.inbox.user.alice.JobSubmitted", b"{}", "a1", timeout=5.0)).stream
        for subject in ("corral.inbox.user.ci.JobSubmitted", "corral.inbox.JobSubmitted",
                        "corral.inbox.admin.alice.NodeDrained", "corral.inbox.node.node-0.WorkerExited"):
            await _refused(alice, subject)
    async with await _connect(url, compose_nats.credentials("ci")) as ci:
        assert (await ci.publish("corral.inbox.user.ci.JobSubmitted", b"{}", "c1", timeout=5.0)).stream
        await _refused(ci, "corral.inbox.user.alice.JobSubmitted")
    kept = json.loads(alice_file.read_text())
    corral(person_argv("--remove", "alice"), tmp)
    compose_nats.reload()
    removed = tmp / "alice-kept.json"
    removed.write_text(json.dumps(kept))
    assert not await _until(lambda: _connects(url, removed), False), "a removed person is refused"
    assert await _connects(url, compose_nats.credentials("ci")), "the others keep their identities"
    assert await _connects(url, compose_nats.mounted("agents/node-1/credentials.json"))
    assert compose_nats.proc.poll() is None, "no restart"


def test_the_compose_file_gives_each_process_only_its_own_identity() -> None:
    text = COMPOSE.read_text()
    assert "CORRAL_NATS_" + "SERVICES_PASSWORD" not in text and "ADMIN_PASSWORD" not in text
    command = SERVICES["nats-identities"]["command"]
    assert command[:3] == ["corral", "credentials", "agent"] and "--export" in command
    nodes = [a for a in command[3:] if not a.startswith("-") and not a.startswith("/")]
    agents = {name: s for name, s in SERVICES.items() if (s.get("command") or [None, None])[:2] == ["corral", "agent"]}
    assert sorted(s["command"][s["command"].index("--node") + 1] for s in agents.values()) == sorted(nodes)

    def subpaths(service: dict[str, Any]) -> dict[str, str]:
        return {v["target"]: v["volume"]["subpath"] for v in service.get("volumes") or []
                if isinstance(v, dict) and v.get("source") == "identities"}

    checked = set()
    for name, service in SERVICES.items():
        env = service.get("environment") or {}
        assert "@" not in str(env.get("CORRAL_NATS_URL", "")), f"{name}: no password in the URL"
        if str(service.get("image", "")).startswith("nats:"):
            assert subpaths(service) == {"/etc/nats-auth": "export/nats"}, name
            assert service["depends_on"]["nats-identities"]["condition"] == "service_completed_successfully"
        elif name in agents:
            node = service["command"][service["command"].index("--node") + 1]
            assert env["CORRAL_NATS_CREDENTIALS"] == "/etc/corral-nats/credentials.json"
            assert subpaths(service) == {"/etc/corral-nats": f"export/agents/{node}"}, name
        elif (service.get("command") or [])[:2] == ["corral", "service"]:
            assert env["CORRAL_NATS_CREDENTIALS"] == "/etc/corral-nats/credentials.json"
            assert subpaths(service) == {"/etc/corral-nats": "export/services"}, name
            checked.add(name)
    assert {"admission", "quota", "placement", "placement-standby", "preemption"} <= checked
    assert "include ../nats-auth/auth.conf" in (DEPLOY / "nats" / "auth.conf").read_text()
