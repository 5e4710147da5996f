"""`corral up`: the whole system on one machine, from nothing, in one command.

Why: a newcomer (and every end-to-end test) needs NATS JetStream, Postgres, the five services and
simulated node agents running together, with no Docker and no servers installed. The services are
separate OS processes, exactly as in production, so killing one (`kill -9`) behaves as it would on
a real cluster. State lives in the data directory: a second `corral up` keeps every event.

Supervision (`supervise`): a child found dead (service, node agents, nats-server, Postgres) is
reaped and restarted with exponential backoff (`RestartBackoff`), never in a tight loop. Alive is
not working: each child also has a liveness check that proves work (`corral.stack.liveness`), and
one that is alive but fails it for its grace is stopped and restarted the same way; a server
whose store's disk is full is restarted only once space is back (it would wedge again).

Shutdown (`stop`) is ordered so that nothing is decided while the system goes down and the log
keeps jobs as they are: placement and preemption first (no new placements or preemptions), then
quota and admission, then the node agents (SIGTERM: a graceful agent stop leaves workers
running, to be adopted by the next start), then nats-server and Postgres. Earlier, the agents
went first, their workers' exits reached a placement still running, and every job FAILED.

Postgres: `corral up` holds the owner's DSN (its embedded Postgres's superuser, password in
`<data_dir>/credentials/pg-superuser.pgpass`, or the DSN it was given), applies the migrations with
it, and gives each service its own login in `corral_service` and the CLI (the context) one in
`corral_reader` (`corral.stack.pglogins`); the node agents get no DSN at all.

One `corral up` per data directory (`DataDirLock`); children left running by a `corral up` that
was killed (kill -9) are found through `pids.json` and stopped, in the same order, before a new
start, so two of them never share a store.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

from corral import environment
from corral.bus import auth
from corral.bus.bus import CA_ENV
from corral.bus.naming import durable_name
from corral.contracts.cluster import read_cluster_file
from corral.stack import credentials, join, people_admin, pglogins, tls
from corral.stack.backoff import RestartBackoff
from corral.stack.context import CONTEXT_FILE, GATEWAY_SOCKET_ENV, Context, owned_by_this_process
from corral.stack.liveness import Liveness
from corral.stack.lock import DataDirLock
from corral.stack.people import Registry
from corral.stack.people_admin import Installation
from corral.stack.server_watch import ServerWatch
from corral.stack.servers import (
    NatsServer,
    PostgresServer,
    command_line,
    free_port,
    http_ok,
    require_dev_servers,
    stop_orphan,
)
from corral.telemetry.endpoint import METRICS_ADDR_ENV

SERVICES: tuple[str, ...] = ("admission", "quota", "placement", "preemption")
DEFAULT_CLUSTER = "4x8:H100"
#: The order of a shutdown, and the seconds each phase is given before SIGKILL: deciders first,
#: so no placement or preemption is decided while the rest goes down; node agents last.
STOP_PHASES: tuple[tuple[tuple[str, ...], float], ...] = (
    (("placement", "placement-standby", "preemption"), 10.0),
    (("quota", "admission"), 10.0),
    (("node-agents",), 30.0),
)


@dataclass
class ManagedProcess:
    """One child process of the stack, restartable by name."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    backoff: RestartBackoff = field(default_factory=RestartBackoff)
    #: Where its /metrics, /healthz and /readyz answer (`corral.telemetry`), e.g. http://127.0.0.1:40123
    metrics_url: str | None = None
    #: Its `/healthz` (answered by its event loop) probed; a minute without an answer is wedged:
    #: longer than any fold of the log blocks that loop, and than the chaos suite's SIGSTOPs.
    liveness: Liveness = field(default_factory=lambda: Liveness(every=5.0, grace=60.0))

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        self.backoff.started(time.monotonic())
        self.liveness.started(time.monotonic())

    def works(self) -> bool:
        """Its liveness check: `/healthz` answers (no endpoint: nothing to judge, it works)."""
        return self.metrics_url is None or http_ok(f"{self.metrics_url}/healthz", 2.0)

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc is not None else None

    def terminate(self) -> None:
        """SIGTERM the process group without waiting (a shutdown phase signals all, then waits)."""
        if self.alive() and self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def wait_gone(self, deadline: float) -> None:
        """Wait until the process has exited, SIGKILL its group at `deadline` (monotonic)."""
        if self.proc is None:
            return
        try:
            self.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(5)

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


class Agents(StrEnum):
    """Which node agents `corral up` runs: simulated nodes on this machine (the one-command dev
    cluster), or none (the control plane only; real hosts run `corral agent`)."""

    SIMULATED = "simulated"
    NONE = "none"


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
    write_user_context: bool = False  # retired: the context lives only in the data folder (context.py)
    extra_env: dict[str, str] = field(default_factory=dict)
    #: People to have in the registry besides the admin (the person running `corral up`), as
    #: `corral user add NAME` would add them; each gets `<data_dir>/credentials/<user>.json`.
    submitters: tuple[str, ...] = ()
    #: Give each service its own Postgres login and the CLI a read-only one (`corral.stack.pglogins`);
    #: off, everything connects with the owner's DSN.
    postgres_logins: bool = True
    #: Our own nats-server requires TLS with a CA generated in `<data_dir>/tls/` (see
    #: `corral.stack.tls`); clients find the CA through the context and `CORRAL_NATS_CA`.
    nats_tls: bool = True
    #: Replicas of each JetStream stream (`CORRAL_STREAM_REPLICAS` for every process); None: the
    #: bus's default (1 for a new stream). Above 1 only with an external NATS cluster (`nats_url`).
    stream_replicas: int | None = None
    agents: Agents = Agents.SIMULATED
    #: Nodes whose agents run elsewhere (`corral agent --node N`): each gets an identity of its own,
    #: `<data_dir>/credentials/agent-node-agent-<N>.json`, when `corral up` runs its own NATS.
    agent_nodes: tuple[str, ...] = ()
    #: Where our own nats-server and Postgres listen (`--listen`; see `corral.stack.join`), and the
    #: address the context and the join commands give clients (None: the listen address).
    listen: str = join.LOOPBACK
    advertise: str | None = None
    #: Run the local gateway (`corral.services.gateway`) on `<data_dir>/gateway/gateway.sock` when
    #: `corral up` runs its own NATS: people of this host submit as their OS account, no credential
    #: file of their own; `<data_dir>/gateway/context.json` is their (public) context.
    gateway: bool = True


@dataclass
class Stack:
    """The running system: servers (unless external), services and node agents."""

    options: StackOptions
    nats: NatsServer | None = None
    postgres: PostgresServer | None = None
    processes: list[ManagedProcess] = field(default_factory=list)
    context: Context | None = None
    say: Callable[[str], None] = field(default=lambda message: None)
    lock: DataDirLock | None = None
    #: The servers it started, each restarted when it exits or is wedged (`ServerWatch`).
    server_watches: dict[str, ServerWatch] = field(default_factory=dict)
    #: The ports of the previous run it could not keep (taken meanwhile): name -> (then, now).
    moved_ports: dict[str, tuple[int, int]] = field(default_factory=dict)

    # ---- start -------------------------------------------------------------------------------
    def start(self) -> Context:
        """Start everything; AlreadyRunning when another `corral up` holds the data directory."""
        opts = self.options
        if opts.stream_replicas is not None and opts.stream_replicas > 1 and not opts.nats_url:
            raise ValueError(f"--replicas {opts.stream_replicas} needs a NATS cluster of at least that many servers: "
                             "give it with --nats nats://HOST1:4222,nats://HOST2:4222,... (the nats-server "
                             "`corral up` starts is one server: --replicas 1)")
        listen = join.check_listen(opts.listen)
        if opts.nats_url and opts.postgres_dsn and (listen != join.LOOPBACK or opts.advertise):
            raise ValueError("--listen/--advertise-address are for the servers `corral up` starts; with --nats "
                             "and --postgres it starts none")
        public = join.advertised(listen, opts.advertise)
        require_dev_servers(nats=not opts.nats_url, postgres=not opts.postgres_dsn)
        opts.data_dir.mkdir(parents=True, exist_ok=True)
        opts.data_dir = opts.data_dir.resolve()
        self.lock = DataDirLock(opts.data_dir)
        self.lock.acquire()
        self._stop_orphans()
        previous = self._previous_ports()
        nats_url = opts.nats_url
        cluster_file = self._cluster_file() if opts.agents is Agents.SIMULATED else None
        keyring: credentials.Keyring | None = None
        tls_files: tls.TlsFiles | None = None
        admin = credentials.admin_name()
        people = Installation(opts.data_dir, opts.namespace)
        registry: Registry | None = None
        if not nats_url:
            # Our own NATS: nobody connects without an identity (see corral.bus.auth), nor without TLS.
            # Its authorization is a file of its own, rewritten by `corral user` (people_admin).
            keyring = self._keyring(cluster_file)
            registry = people_admin.prepare(people, keyring.identities, admin, opts.submitters)
            tls_files = tls.generate(opts.data_dir / "tls", tls.default_hosts(*join.certificate_hosts(
                listen, opts.advertise))) if opts.nats_tls else None
            self.nats = NatsServer(opts.data_dir / "nats", host=listen, advertise=public,
                                   port=self._keep("nats", previous, listen),
                                   authorization_include=people_admin.AUTH_FILE,
                                   monitor_port=self._keep("nats-monitor", previous),
                                   tls=tls_files.server_block() if tls_files else "").start()
            nats_url = self.nats.url
        dsn = opts.postgres_dsn
        if not dsn:
            self.postgres = PostgresServer(opts.data_dir / "postgres", host=listen, advertise=public,
                                           port=self._keep("postgres", previous, listen),
                                           password_file=opts.data_dir / "credentials" / "pg-superuser.pgpass"
                                           ).start()
            dsn = self.postgres.dsn
        # As the owner: migrate, then one login per service, one read-only for the CLI and one per
        # person; `corral user` creates and drops people's logins with the owner's DSN kept here.
        logins = pglogins.provision(dsn, opts.data_dir, SERVICES, say=self.say,
                                    people=registry.names() if registry else ()) if opts.postgres_logins else None
        owner_file = opts.data_dir / "credentials" / pglogins.OWNER_DSN_FILE
        if logins is not None:
            credentials.write_private(owner_file, dsn + "\n")
        else:
            owner_file.unlink(missing_ok=True)
        log_dir = opts.data_dir / "logs"
        gateway_socket = self._gateway_socket() if keyring is not None and opts.gateway else None
        self.context = owned_by_this_process(Context(
            nats_url=nats_url, postgres_dsn=logins.reader if logins else dsn, namespace=opts.namespace,
            data_dir=str(opts.data_dir.resolve()), log_dir=str(log_dir.resolve()),
            credentials=str(people.credentials_file(admin)) if keyring else None,
            nats_ca=str(tls_files.ca) if tls_files else None, gateway=gateway_socket))
        self._save_ports()
        env = {**environment.mapping(), **opts.extra_env,
               "CORRAL_NATS_URL": nats_url, "CORRAL_POSTGRES_DSN": dsn,
               "CORRAL_NAMESPACE": opts.namespace, "CORRAL_LOG_DIR": str(log_dir.resolve()),
               "PYTHONUNBUFFERED": "1"}
        if opts.stream_replicas is not None:
            env["CORRAL_STREAM_REPLICAS"] = str(opts.stream_replicas)
        env.pop(credentials.CREDENTIALS_ENV, None)
        if tls_files is not None:
            env[CA_ENV] = str(tls_files.ca)
        elif self.nats is not None:
            env.pop(CA_ENV, None)
        py = sys.executable
        for name in SERVICES:
            self.processes.append(ManagedProcess(
                name, [py, "-m", f"corral.services.{name}"], env, log_dir / f"{name}.log"))
            if name == "placement" and opts.placement_standby:
                self.processes.append(ManagedProcess(
                    "placement-standby", [py, "-m", "corral.services.placement"], env,
                    log_dir / "placement-standby.log"))
        if cluster_file is not None:
            self.processes.append(ManagedProcess(
                "node-agents",
                [py, "-m", "corral.services.node_agent", "--inventory", str(cluster_file),
                 "--runtime", opts.runtime, "--state-dir", str((opts.data_dir / "nodes").resolve()),
                 "--advertise-address", "none", "--port-range", "auto"],
                # One box, one user: every job runs as whoever ran `corral up` (export
                # CORRAL_AGENT_RUN_AS=submitter to run them as their submitters; docs/security.md).
                {**env, "CORRAL_AGENT_RUN_AS": env.get("CORRAL_AGENT_RUN_AS") or "agent"},
                log_dir / "node-agents.log"))
        if gateway_socket is not None:
            self.processes.append(ManagedProcess(
                "gateway", [py, "-m", "corral.services.gateway"], {**env, GATEWAY_SOCKET_ENV: gateway_socket},
                log_dir / "gateway.log"))
        if keyring is not None:
            for p in self.processes:
                user = {"node-agents": self._agent_user, "gateway": auth.GATEWAY_USER}.get(
                    p.name, "svc-" + p.name.removesuffix("-standby"))
                p.env = {**p.env, credentials.CREDENTIALS_ENV: str(keyring.path(user))}
        for p in self.processes:
            if p.name == "node-agents":  # the agents never touch Postgres: no DSN at all
                p.env = {k: v for k, v in p.env.items() if k != "CORRAL_POSTGRES_DSN"}
            elif p.name == "gateway" and logins is not None:  # it reads: the CLI's read login
                p.env = {**p.env, "CORRAL_POSTGRES_DSN": logins.reader}
            elif logins is not None:
                p.env = {**p.env, "CORRAL_POSTGRES_DSN": logins.service(p.name.removesuffix("-standby"))}
        self._metrics_addresses(previous)
        self.context = replace(self.context, metrics={p.name: p.metrics_url for p in self.processes if p.metrics_url})
        for p in self.processes:
            p.start()
        self._save_pids()
        self._save_ports()
        self._save_scrape_targets()
        self.context.save(opts.data_dir / CONTEXT_FILE)  # `.corral/context.json` for the default data dir
        if gateway_socket is not None:
            self._save_public_context(self.context)
        return self.context

    def _gateway_socket(self) -> str:
        """`<data_dir>/gateway/gateway.sock`, in a folder every account may traverse and read."""
        folder = self.options.data_dir / "gateway"
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o755)
        closed = closed_to_others(folder)
        if closed is not None:
            self.say(f"gateway: other accounts cannot reach {folder} ({closed} is not traversable by them): "
                     f"`chmod o+x {closed}` to let the people of this host submit through it")
        return str(folder / "gateway.sock")

    def _save_public_context(self, ctx: Context) -> None:
        """`<data_dir>/gateway/context.json` (0644): where the cluster and its gateway are, for the
        people of this host (`CORRAL_CONTEXT=<data_dir>/gateway`). It names no credential: theirs
        is their uid."""
        path = self.options.data_dir / "gateway" / CONTEXT_FILE
        replace(ctx, credentials=None, metrics=None, nats_identity=None, postgres_password=None).save(path)
        os.chmod(path, 0o644)

    _agent_user: str = "agent"

    def join_commands(self) -> list[join.JoinCommand]:
        """How each `--agent-node` joins from its own host (none with an external NATS: its
        identities are the operator's, see `corral credentials`)."""

        ctx = self.context
        if ctx is None or self.nats is None:
            return []
        keys = self.options.data_dir / "credentials"
        ca = Path(ctx.nats_ca) if ctx.nats_ca else None
        return [join.join_command(n, ctx.nats_url, ctx.namespace, keys / f"agent-{durable_name([n])}.json", ca)
                for n in self.options.agent_nodes]

    def _save_scrape_targets(self) -> None:
        """`<data_dir>/telemetry/targets.json`: the endpoints as Prometheus's file_sd reads them
        (deploy/prometheus/prometheus.yml, job corral-up)."""
        targets = [{"targets": [p.metrics_url.removeprefix("http://")],
                    "labels": {"process": p.name, "namespace": self.options.namespace}}
                   for p in self.processes if p.metrics_url]
        folder = self.options.data_dir / "telemetry"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "targets.json").write_text(json.dumps(targets, indent=2) + "\n")

    def _metrics_addresses(self, previous: dict[str, int]) -> None:
        """A port on 127.0.0.1 for each process's telemetry endpoint (`CORRAL_METRICS_ADDR`), the
        previous run's when still free, so dashboards and contexts keep working across restarts."""
        for p in self.processes:
            port = self._keep(f"metrics:{p.name}", previous, reuse_address=True) or free_port()
            p.env = {**p.env, METRICS_ADDR_ENV: f"127.0.0.1:{port}"}
            p.metrics_url = f"http://127.0.0.1:{port}"

    def _keyring(self, cluster_file: Path | None) -> credentials.Keyring:
        """Every identity of this installation (created once, kept across restarts): the simulated
        agents' process (hosting every node of `cluster_file`) and one per external agent node."""

        agents: list[tuple[list[str], str]] = [([n], durable_name([n])) for n in self.options.agent_nodes]
        if cluster_file is not None:
            nodes = [inv.node for inv in read_cluster_file(cluster_file).inventories()]
            durable = durable_name(nodes)
            agents.append((nodes, durable))
            self._agent_user = f"agent-{durable}"
        return credentials.generate(self.options.data_dir, self.options.namespace, services=SERVICES,
                                    agents=agents, admin=None, gateway=self.options.gateway)

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

    def _keep(self, name: str, previous: dict[str, int], host: str = join.LOOPBACK, *,
              reuse_address: bool = False) -> int:
        """`_reuse` of the previous run's port for `name`, noting it in `moved_ports` (and saying
        so) when another process took it meanwhile."""
        then = previous.get(name)
        port = _reuse(then, host, reuse_address=reuse_address)
        if then is not None and port != then:
            self.moved_ports[name] = (then, port)
            self.say(f"{name}: port {then} of the previous run is taken by another process; using {port}")
        return port

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
            ports["nats-monitor"] = self.nats.monitor_port
        if self.postgres:
            ports["postgres"] = self.postgres.port
        for p in self.processes:
            if p.metrics_url:
                ports[f"metrics:{p.name}"] = int(p.metrics_url.rsplit(":", 1)[1])
        (self.options.data_dir / "ports.json").write_text(json.dumps(ports))

    # ---- run / stop --------------------------------------------------------------------------
    def process(self, name: str) -> ManagedProcess:
        for p in self.processes:
            if p.name == name:
                return p
        raise KeyError(name)

    def dead(self) -> Iterable[ManagedProcess]:
        return [p for p in self.processes if not p.alive()]

    def supervise(self, now: float | None = None) -> None:
        """One round of supervision: reap what died, schedule its restart with backoff, restart
        what is due. Servers first: a service restarted without its Postgres would just crash."""
        now = time.monotonic() if now is None else now
        for name, server in (("nats", self.nats), ("postgres", self.postgres)):
            if server is None:
                continue
            watch = self.server_watches.get(name)
            if watch is None or watch.server is not server:
                watch = self.server_watches[name] = ServerWatch(name, server, say=self.say)
            if watch.round(now):
                self._save_pids()
        for p in self.processes:
            if not p.backoff.waiting and not p.alive():
                delay = p.backoff.exited(now)
                self.say(f"{p.name} exited ({p.returncode}); restarting it in {delay:.1f}s")
            elif p.backoff.due(now):
                p.start()
                self.say(f"{p.name} restarted (pid {p.pid})")
                self._save_pids()
            elif p.liveness.due(now) and p.liveness.observe(now, p.works()):
                self.say(f"{p.name} is alive but has not answered its liveness check (/healthz) for "
                         f"{p.liveness.grace:.0f}s; killing it to restart it")
                p.kill()

    def stop(self) -> None:
        """Stop in STOP_PHASES order (deciders first, node agents last), then the servers."""
        phased = {name for names, _ in STOP_PHASES for name in names}
        phases = [(names, grace) for names, grace in STOP_PHASES]
        phases.insert(1, (tuple(p.name for p in self.processes if p.name not in phased), 10.0))
        for names, grace in phases:
            group = [p for p in self.processes if p.name in names and p.proc is not None]
            if not group:
                continue
            for p in group:
                p.terminate()
            deadline = time.monotonic() + grace
            for p in group:
                p.wait_gone(deadline)
                self.say(f"stopped {p.name}")
                p.proc = None
        self.processes.clear()
        if self.nats:
            self.nats.stop()
            self.say("stopped nats")
        if self.postgres:
            self.postgres.stop()
            self.say("stopped postgres")
        self._save_pids()
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    # ---- children left by a killed `corral up` --------------------------------------------------
    def _save_pids(self) -> None:
        """Every child's pid and command line, for the next start to find what a kill -9 left."""
        children = {p.name: {"pid": p.pid, "argv": p.argv} for p in self.processes if p.alive()}
        with contextlib.suppress(OSError):  # a data directory removed under us: nothing to record
            (self.options.data_dir / "pids.json").write_text(json.dumps(children))

    def _stop_orphans(self) -> None:
        """Stop the children of a previous `corral up` still running (it was killed), deciders
        first as in `stop`. A pid is only signalled when it still runs the recorded command."""
        path = self.options.data_dir / "pids.json"
        try:
            recorded: dict[str, dict[str, object]] = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        order = [n for names, _ in STOP_PHASES for n in names]
        for name in sorted(recorded, key=lambda n: order.index(n) if n in order else 1):
            pid, argv = recorded[name].get("pid"), recorded[name].get("argv")
            if isinstance(pid, int) and command_line(pid) == argv:
                self.say(f"stopping {name} (pid {pid}) left running by an earlier `corral up`")
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGTERM)
                stop_orphan(pid, signal.SIGTERM, 30.0 if name == "node-agents" else 10.0)
        path.unlink(missing_ok=True)


def closed_to_others(folder: Path) -> Path | None:
    """The first folder on the way to `folder` (itself included) that an account with no group of
    its owner's may not traverse, or None."""
    import stat

    for step in (*reversed(folder.parents), folder):
        if not step.stat().st_mode & stat.S_IXOTH:
            return step
    return None


def _reuse(port: int | None, host: str = join.LOOPBACK, *, reuse_address: bool = False) -> int:
    """Keep the previous port across restarts when it is still free, so old contexts stay valid.
    `reuse_address`: the server binds with SO_REUSEADDR (the telemetry endpoints), so a port whose
    last connections linger in TIME_WAIT is free for it."""
    if port is None:
        return 0
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        if reuse_address:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return free_port(host)
    return port


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
