"""A cluster of hosts that are network namespaces (tests/netns.py): `corral server --listen` on
one, `corral agent` on three others, started with the join line the server printed, and a login
host where the test's client (the admin's context) runs, as a CLI on another machine would.

Nothing is given that a real operator would not have: the agents get the join line's URL,
CA and credentials (copied to the host's own folder), a declared inventory, a state folder and a
checkpoint folder shared by every host (the cluster's shared storage); each advertises what it
finds itself (its address towards NATS) and lends the default rendezvous ports of its own stack.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.client import Client
from corral.contracts.queues import validate_queues
from corral.stack.context import Context, with_password
from tests.netns import NamespaceLoop, Network

SERVER = "server"
LOGIN = "login"
AGENT_HOSTS = ("host-a", "host-b", "host-c")
GPUS_PER_HOST = 2
#: placement declares a silent host lost after this long (the default 10 s, shortened for the test)
NODE_LOST_SECONDS = 6


def clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    return {**env, "HOME": str(home), "PYTHONUNBUFFERED": "1", "CORRAL_LOG_LEVEL": "INFO", "COLUMNS": "200"}


def corral() -> str:
    """The `corral` command of the venv running the tests (what the join line's `corral` is)."""
    return shutil.which("corral", path=str(Path(sys.executable).parent)) or "corral"


@dataclass
class Agent:
    host: str
    root: Path  # the host's own folder: etc/corral (copied files), state/
    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def log(self) -> Path:
        return self.root / f"agent-{self.starts}.log"

    def logs(self) -> str:
        return "\n".join(f"==== agent {self.host} start {p.stem}\n" + p.read_text(errors="replace")[-4000:]
                         for p in sorted(self.root.glob("agent-*.log")))


@dataclass
class NetnsCluster:
    net: Network
    root: Path
    server: subprocess.Popen[bytes] | None = None
    status: dict[str, Any] = field(default_factory=dict)
    agents: dict[str, Agent] = field(default_factory=dict)
    loop: NamespaceLoop | None = None
    client: Client | None = None

    @property
    def data(self) -> Path:
        return self.root / "server"

    @property
    def checkpoints(self) -> Path:
        return self.root / "shared" / "checkpoints"

    def address(self, host: str) -> str:
        return self.net.hosts[host].address

    def start_server(self) -> None:
        """`corral server` on its host, listening on that host's address only."""
        env = {**clean_env(self.root), "CORRAL_NODE_LOST_SECONDS": str(NODE_LOST_SECONDS)}
        argv = [corral(), "server", "--data-dir", str(self.data), "--listen", self.address(SERVER), "--json",
                *(a for h in AGENT_HOSTS for a in ("--agent-node", h))]
        with (self.root / "server.err").open("wb") as err:
            self.server = subprocess.Popen(self.net.command(SERVER, argv), stdout=subprocess.PIPE, stderr=err,
                                           env=env, cwd=self.root)
        assert self.server.stdout is not None
        lines = []
        for raw in self.server.stdout:
            lines.append(raw.decode())
            if raw.rstrip() == b"}":
                break
        if not lines or lines[-1].rstrip() != "}":
            raise AssertionError(f"corral server printed no status:\n{''.join(lines)}\n"
                                 f"{(self.root / 'server.err').read_text()[-4000:]}")
        self.status = json.loads("".join(lines))

    def prepare_agents(self) -> None:
        """Each host's agent as its join line says, with the copied files under the host's folder."""
        inventory = self.root / "inventory.json"
        inventory.write_text(json.dumps({"nodes": [{"name": h, "gpus": GPUS_PER_HOST, "model": "CPU"}
                                                   for h in AGENT_HOSTS]}))
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        for join in self.status["join"]:
            host = join["node"]
            root = self.root / host
            moved = {}
            for item in join["copy"]:
                target = root / Path(item["to"]).relative_to("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(item["from"], target)
                moved[item["to"]] = str(target)
            env = clean_env(root) | {k: moved.get(v, v) for k, v in join["env"].items()}
            env |= {"CORRAL_AGENT_RUN_AS": "agent"}
            assert join["argv"][0] == "corral", join
            argv = [corral(), *join["argv"][1:], "--inventory", str(inventory), "--state-dir", str(root / "state"),
                    "--checkpoint-dir", str(self.checkpoints)]
            self.agents[host] = Agent(host, root, argv, env)

    def start_agent(self, host: str) -> None:
        agent = self.agents[host]
        agent.starts += 1
        with agent.log.open("wb") as out:
            agent.proc = subprocess.Popen(self.net.command(host, agent.argv), env=agent.env, stdout=out,
                                          stderr=subprocess.STDOUT, cwd=agent.root)

    def restart_agent(self, host: str) -> None:
        """SIGKILL the agent (`ip netns exec` execs it: the Popen's pid is the agent's) and start
        it again at once. The new process is started first and waits, its imports done, for the
        old one to die: on a loaded test machine starting an interpreter alone can take longer than
        the node-lost limit, which counts from the old agent's last heartbeat."""
        agent = self.agents[host]
        old = agent.proc
        assert old is not None
        agent.starts += 1
        go = agent.root / f"go-{agent.starts}"
        with agent.log.open("wb") as out:
            agent.proc = subprocess.Popen(
                self.net.command(host, [sys.executable, "-c", _WARM, str(go), *agent.argv[1:]]), env=agent.env,
                stdout=out, stderr=subprocess.STDOUT, cwd=agent.root)
        deadline = time.monotonic() + 60
        while not go.with_suffix(".ready").exists():
            assert agent.proc.poll() is None and time.monotonic() < deadline, agent.logs()
            time.sleep(0.05)
        old.send_signal(signal.SIGKILL)
        old.wait(10)
        go.touch()

    def dsn(self) -> str:
        """The admin's Postgres DSN, with its password (the context keeps it apart)."""
        ctx = Context.load(self.data / "context.json")
        return with_password(ctx.postgres_dsn, ctx.postgres_password) if ctx.postgres_password else ctx.postgres_dsn

    def connect(self) -> Client:
        self.loop = NamespaceLoop(self.net.hosts[LOGIN].netns)
        self.client = self.loop.run(Client.connect(Context.load(self.data / "context.json")))
        return self.client

    def run(self, coro: Any, timeout: float = 180) -> Any:
        assert self.loop is not None
        return self.loop.run(coro, timeout)

    def logs(self) -> str:
        out = []
        for name in ("placement", "admission", "quota"):
            path = self.data / "logs" / f"{name}.log"
            if path.exists():
                out.append(f"==== {name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-60:]))
        out.extend(a.logs() for a in self.agents.values())
        return "\n".join(out)

    def stop(self) -> None:
        if self.client is not None:
            try:
                self.run(self.client.close(), 10)
            except Exception:  # a failed close must not keep the namespaces alive
                pass
        if self.loop is not None:
            self.loop.close()
        for agent in self.agents.values():  # their stepds and ranks die with the namespaces
            if agent.proc is not None and agent.proc.poll() is None:
                agent.proc.kill()
        for agent in self.agents.values():
            _wait(agent.proc, 10)
        if self.server is not None and self.server.poll() is None:
            self.server.send_signal(signal.SIGINT)  # the ordered stop: placement first
            _wait(self.server, 60)


#: `corral agent ARGS` once GO exists, its modules imported before (GO.ready says so): the agent's
#: entry point itself, which `corral agent` execs.
_WARM = """
import pathlib, sys, time
import corral.services.node_agent.__main__ as agent  # the agent's own imports
go = pathlib.Path(sys.argv[1])
go.with_suffix(".ready").touch()
while not go.exists():
    time.sleep(0.02)
assert sys.argv[2] == "agent", sys.argv
sys.exit(agent.main(sys.argv[3:]))
"""


def _wait(proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    if proc is None:
        return
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def start(net: Network, root: Path) -> Iterator[NetnsCluster]:
    """The whole cluster up, queue team-a over every GPU, the client connected; stopped (and the
    namespaces' leftovers killed by the caller's `Network`) afterwards."""
    cluster = NetnsCluster(net, root)
    began = time.monotonic()
    try:
        cluster.start_server()
        cluster.prepare_agents()
        for host in AGENT_HOSTS:
            cluster.start_agent(host)
        c = cluster.connect()
        cluster.run(c.apply_queues(validate_queues(
            {"queues": [{"name": "team-a", "guaranteed_gpus": GPUS_PER_HOST * len(AGENT_HOSTS)}]})))
        cluster.run(c.wait_for(lambda v: "team-a" in v.queues and
                               sum(1 for n in v.nodes.values() if not n.lost) == len(AGENT_HOSTS), 60))
        print(f"netns cluster of {len(AGENT_HOSTS)} hosts up in {time.monotonic() - began:.1f}s")
        yield cluster
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.stop()
