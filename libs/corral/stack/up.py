"""`corral up`: the whole system on one machine, from nothing, in one command.

Why: a newcomer (and every end-to-end test) needs NATS JetStream, Postgres, the five services and
simulated node agents running together, with no Docker and no servers installed. The services are
separate OS processes, exactly as in production, so killing one (`kill -9`) behaves as it would on
a real cluster. State lives in the data directory: a second `corral up` keeps every event.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from corral.stack import credentials
from corral.stack.context import LOCAL_CONTEXT, Context, user_context_path
from corral.stack.servers import NatsServer, PostgresServer, free_port

SERVICES: tuple[str, ...] = ("admission", "quota", "placement", "preemption")
DEFAULT_CLUSTER = "4x8:H100"


@dataclass
class ManagedProcess:
    """One child process of the stack, restartable by name."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive() and self.proc is not None:
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(5)
        self.proc = None


@dataclass
class StackOptions:
    data_dir: Path
    cluster: str | None = None  # shorthand such as 4x8:H100
    cluster_file: Path | None = None
    nats_url: str | None = None
    postgres_dsn: str | None = None
    namespace: str = "corral"
    runtime: str = "sim"
    placement_standby: bool = True
    write_user_context: bool = True
    extra_env: dict[str, str] = field(default_factory=dict)
    #: Submitter identities to create besides the admin (the person running `corral up`); each gets
    #: `<data_dir>/credentials/<user>.json` (see `corral.stack.credentials`).
    submitters: tuple[str, ...] = ()


@dataclass
class Stack:
    """The running system: servers (unless external), services and node agents."""

    options: StackOptions
    nats: NatsServer | None = None
    postgres: PostgresServer | None = None
    processes: list[ManagedProcess] = field(default_factory=list)
    context: Context | None = None

    # ---- start -------------------------------------------------------------------------------
    def start(self) -> Context:
        opts = self.options
        opts.data_dir.mkdir(parents=True, exist_ok=True)
        opts.data_dir = opts.data_dir.resolve()
        previous = self._previous_ports()
        nats_url = opts.nats_url
        cluster_file = self._cluster_file()
        keyring: credentials.Keyring | None = None
        if not nats_url:
            # Our own NATS: nobody connects without an identity (see corral.bus.auth).
            keyring = self._keyring(cluster_file)
            self.nats = NatsServer(opts.data_dir / "nats", port=_reuse(previous.get("nats")),
                                   authorization=keyring.authorization()).start()
            nats_url = self.nats.url
        dsn = opts.postgres_dsn
        if not dsn:
            self.postgres = PostgresServer(opts.data_dir / "postgres",
                                           port=_reuse(previous.get("postgres"))).start()
            dsn = self.postgres.dsn
        log_dir = opts.data_dir / "logs"
        admin = credentials.admin_name()
        self.context = Context(nats_url=nats_url, postgres_dsn=dsn, namespace=opts.namespace,
                               data_dir=str(opts.data_dir.resolve()), log_dir=str(log_dir.resolve()),
                               credentials=str(keyring.path(admin)) if keyring else None)
        self._save_ports()
        env = {**os.environ, **opts.extra_env,
               "CORRAL_NATS_URL": nats_url, "CORRAL_POSTGRES_DSN": dsn,
               "CORRAL_NAMESPACE": opts.namespace, "CORRAL_LOG_DIR": str(log_dir.resolve()),
               "PYTHONUNBUFFERED": "1"}
        env.pop(credentials.CREDENTIALS_ENV, None)
        if keyring is not None:
            env["CORRAL_ADMINS"] = admin
        py = sys.executable
        for name in SERVICES:
            self.processes.append(ManagedProcess(
                name, [py, "-m", f"corral.services.{name}"], env, log_dir / f"{name}.log"))
            if name == "placement" and opts.placement_standby:
                self.processes.append(ManagedProcess(
                    "placement-standby", [py, "-m", "corral.services.placement"], env,
                    log_dir / "placement-standby.log"))
        self.processes.append(ManagedProcess(
            "node-agents",
            [py, "-m", "corral.services.node_agent", "--cluster-file", str(cluster_file),
             "--runtime", opts.runtime, "--work-dir", str((opts.data_dir / "nodes").resolve())],
            env, log_dir / "node-agents.log"))
        if keyring is not None:
            for p in self.processes:
                user = "svc-" + p.name.removesuffix("-standby") if p.name != "node-agents" else self._agent_user
                p.env = {**p.env, credentials.CREDENTIALS_ENV: str(keyring.path(user))}
        for p in self.processes:
            p.start()
        self.context.save(opts.data_dir / "context.json")
        paths = [LOCAL_CONTEXT] if opts.data_dir.resolve() == LOCAL_CONTEXT.parent.resolve() else []
        if opts.write_user_context:
            paths.append(user_context_path())
        if paths:
            self.context.save(*paths)
        return self.context

    _agent_user: str = "agent"

    def _keyring(self, cluster_file: Path) -> credentials.Keyring:
        """Every identity of this installation (created once, kept across restarts)."""
        from corral.services.node_agent.__main__ import read_cluster
        from corral.services.node_agent.service import durable_name

        nodes = [inv.node for inv in read_cluster(cluster_file).inventories()]
        durable = durable_name(nodes)
        keyring = credentials.generate(self.options.data_dir, self.options.namespace, services=SERVICES,
                                       agents=[(nodes, durable)], admin=credentials.admin_name(),
                                       submitters=self.options.submitters)
        self._agent_user = f"agent-{durable}"
        return keyring

    def _cluster_file(self) -> Path:
        """The cluster the simulated agents declare: given, or remembered from the last run."""
        opts = self.options
        saved = opts.data_dir / "cluster.json"
        if opts.cluster_file is not None:
            text = opts.cluster_file.read_text()
            saved.write_text(json.dumps({"file": str(opts.cluster_file.resolve()), "text": text}))
            return opts.cluster_file
        if opts.cluster is not None or not saved.exists():
            saved.write_text(json.dumps({"shorthand": opts.cluster or DEFAULT_CLUSTER}))
        raw = json.loads(saved.read_text())
        if "shorthand" in raw:
            target = opts.data_dir / "cluster.shorthand"
            target.write_text(raw["shorthand"] + "\n")
            return target
        return Path(raw["file"])

    def _previous_ports(self) -> dict[str, int]:
        path = self.options.data_dir / "ports.json"
        try:
            return {k: int(v) for k, v in json.loads(path.read_text()).items()}
        except (OSError, ValueError):
            return {}

    def _save_ports(self) -> None:
        ports = {}
        if self.nats:
            ports["nats"] = self.nats.port
        if self.postgres:
            ports["postgres"] = self.postgres.port
        (self.options.data_dir / "ports.json").write_text(json.dumps(ports))

    # ---- run / stop --------------------------------------------------------------------------
    def process(self, name: str) -> ManagedProcess:
        for p in self.processes:
            if p.name == name:
                return p
        raise KeyError(name)

    def dead(self) -> Iterable[ManagedProcess]:
        return [p for p in self.processes if not p.alive()]

    def stop(self) -> None:
        for p in reversed(self.processes):
            p.stop()
        self.processes.clear()
        if self.nats:
            self.nats.stop()
        if self.postgres:
            self.postgres.stop()


def _reuse(port: int | None) -> int:
    """Keep the previous port across restarts when it is still free, so old contexts stay valid."""
    if port is None:
        return 0
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return free_port()
    return port


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
