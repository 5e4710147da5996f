"""The node agent's one entry point: `corral agent` (which runs this) or `python -m corral.services.node_agent`.

One process hosts the agents of one real host, or of many fake nodes on one machine:
- a real host: `--inventory nvml` (the default) finds this machine's GPUs through NVML; the node
  is named after the host (or `--node NAME`); it advertises the address other hosts reach it at
  (the local address towards NATS, or `--advertise-address`) and the ports it lends to rendezvous
  (`--port-range`), and connects with the NATS URL, credentials and CA of the cluster;
- fake nodes (`corral up`, tests): `--inventory FILE`, a cluster file (YAML/JSON, or a shorthand
  such as `4x8:H100`) or a fake inventory; one agent per node of FILE, or per `--node` chosen from
  it. `corral up` adds `--advertise-address none` (its gangs meet at placement's
  `CORRAL_MASTER_ADDR`) and `--port-range auto` (outside this machine's ephemeral ports).

Workers outlive the agent (each gang runs under its own stepd): SIGTERM/SIGINT leave them running
for the next agent to adopt (an upgrade). `--stop-workers-on-exit` (or
CORRAL_AGENT_STOP_WORKERS_ON_EXIT=1) stops them first instead, as tests that clean up need.

Whose OS user runs a job's ranks: `--run-as submitter` (the default; env CORRAL_AGENT_RUN_AS)
runs each job as the OS account named by its submitting user when the agent is root, and refuses
jobs whose user has no account here or is root in a queue without `allow_root: true`; an agent
that is not root cannot switch and runs them as itself. `--run-as agent` runs every job as the
agent's own user: a single-user box (`corral up` sets it). See docs/security.md.

Environment: CORRAL_NATS_URL (else the `corral up` context file: CORRAL_CONTEXT or the nearest
.corral/context.json), CORRAL_NAMESPACE (default corral), CORRAL_LOG_DIR (rank logs go to
`$CORRAL_LOG_DIR/workers/<job>/rank-<N>.log`, else `<state-dir>/logs/...`), CORRAL_LOG_LEVEL, and
the variable named in each option's help. A flag, file or environment that cannot work is one line
naming it and the fix, exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

import msgspec

from corral import environment
from corral.bus.naming import durable_name
from corral.contracts import events as ev
from corral.contracts.cluster import GPU_MEMORY_GIB, ClusterSpec, GpuDevice, NodeInventory, read_cluster_file
from corral.contracts.problems import SpecError
from corral.core.rendezvous import AGENT_PORT_RANGE, parse_port_range
from corral.profiling import profiled
from corral.stack.context import DEFAULT_NAMESPACE, Context, locate
from corral.telemetry import logs
from corral.telemetry.endpoint import DEFAULT_ADDRESS, METRICS_ADDR_ENV, parse_address

from .host.ephemeral_ports import ephemeral_range, local_rendezvous_ports, port_range_warning
from .host.inventory import NvmlUnavailable, discover, load_declared_inventories
from .process.run_as import RUN_AS_ENV, RunAs
from .service import AgentOptions, run_agents

USAGE_ERROR = 2
NVML = "nvml"
#: `--advertise-address none`: no address (placement's `CORRAL_MASTER_ADDR` for every gang here).
NO_ADDRESS = "none"
#: `--port-range auto`: a range outside this host's ephemeral ports (`local_rendezvous_ports`).
AUTO_PORTS = "auto"

log = logging.getLogger("corral.agent")


class UsageError(Exception):
    """A flag, file or environment that cannot work: one line naming it and the fix, exit 2."""


def _env_flag(name: str) -> bool:
    return (environment.get(name) or "").strip().lower() not in ("", "0", "false", "no")


def default_node_name() -> str:
    """This host's short name as a node name (letters, digits, '.', '_', '-')."""
    short = socket.gethostname().split(".")[0]
    name = "".join(c if c.isalnum() or c in "_-" else "-" for c in short).strip("-_")
    return name or "node"


def default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/corral/agent")
    return Path(environment.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "corral" / "agent"


def parser(prog: str = "corral agent") -> argparse.ArgumentParser:
    # allow_abbrev=False: an unknown flag is an error, never silently another one.

    def env(name: str, default: str = "") -> str:  # an empty variable takes the default
        return environment.get(name) or default

    p = argparse.ArgumentParser(prog=prog, allow_abbrev=False, description=(
        "Run this host's node agent (one per GPU host), or the agents of fake nodes: registers each node "
        "with its GPUs, address and rendezvous ports and runs the ranks placement gives it, until SIGTERM "
        "or Ctrl-C."))
    p.add_argument("--node", metavar="NAME",
                   action="append", help="Node name (default: this host's name); repeatable with "
                   "an inventory FILE to run only those of its nodes (default: all of them)")
    p.add_argument("--inventory", metavar="nvml|FILE",
                   default=NVML, help="Where the GPUs come from: nvml, this machine's (default); or FILE, a cluster "
                   "file (YAML/JSON, or a shorthand such as 4x8:H100) or a fake inventory declaring the "
                   "nodes' GPUs (machines without GPUs, tests)")
    p.add_argument("--advertise-address", metavar="ADDR|none", default=env("CORRAL_ADVERTISE_ADDRESS") or None,
                   help="Address other hosts reach this one at; rank 0's node's address is a gang's MASTER_ADDR "
                   "(default: the local address used to reach NATS; none: no address, placement's "
                   "CORRAL_MASTER_ADDR; env CORRAL_ADVERTISE_ADDRESS)")
    p.add_argument("--port-range", metavar="LO-HI|auto",
                   default=env("CORRAL_RENDEZVOUS_PORTS") or "{}-{}".format(*AGENT_PORT_RANGE),
                   help="Ports LO-HI this host lends to rendezvous (MASTER_PORT of gangs whose rank 0 runs here), "
                   "kept free of other services; auto: a range outside this host's ephemeral ports "
                   "(default %(default)s; env CORRAL_RENDEZVOUS_PORTS)")
    p.add_argument("--state-dir", metavar="DIR",
                   type=Path, default=Path(env("CORRAL_AGENT_STATE_DIR") or default_state_dir()),
                   help="Control files and, by default, checkpoints and logs (default %(default)s; env "
                   "CORRAL_AGENT_STATE_DIR)")
    p.add_argument("--credentials", metavar="FILE", type=Path, default=env("CORRAL_NATS_CREDENTIALS") or None,
                   help="The agent's NATS credentials file (docs/security.md; env CORRAL_NATS_CREDENTIALS)")
    p.add_argument("--nats-ca", metavar="FILE", default=env("CORRAL_NATS_CA") or None,
                   help="CA file the NATS server's certificate must chain to (env CORRAL_NATS_CA)")
    p.add_argument("--runtime", choices=("process", "sim", "sim-timer"), default="process",
                   help="How ranks run: process, each job as its spec says (default); sim: simulate every job; "
                   "sim-timer: simulate every job as a timer inside the agent (no process per rank)")
    p.add_argument("--rack", metavar="RACK", default="rack-0", help="Rack of an nvml node (default rack-0)")
    p.add_argument("--zone", metavar="ZONE", default="zone-0", help="Zone of an nvml node (default zone-0)")
    p.add_argument("--model", metavar="MODEL", help="Model name to report for an nvml node's GPUs (default: from NVML)")
    p.add_argument("--checkpoint-dir", metavar="DIR",
                   type=Path, help="Root of CORRAL_CHECKPOINT_DIR: shared storage when jobs "
                   "resume on other hosts (default: the cluster file's checkpoint_dir, else "
                   "<state-dir>/checkpoints)")
    p.add_argument("--log-dir", metavar="DIR", type=Path, help="Rank logs root (default $CORRAL_LOG_DIR/workers, else "
                   "<state-dir>/logs)")
    p.add_argument("--run-as", choices=[m.value for m in RunAs], default=None,
                   help="Whose OS account runs a job: submitter, its submitting user's when this agent is root "
                   f"(default); agent, this agent's user for every job (a single-user box). Env {RUN_AS_ENV}")
    p.add_argument("--stop-workers-on-exit", action="store_true",
                   default=_env_flag("CORRAL_AGENT_STOP_WORKERS_ON_EXIT"),
                   help="On SIGTERM/SIGINT stop every gang first (default: leave them running for the next "
                   "agent to adopt; env CORRAL_AGENT_STOP_WORKERS_ON_EXIT=1)")
    p.add_argument("--metrics-address", metavar="HOST:PORT|off", default=env(METRICS_ADDR_ENV) or DEFAULT_ADDRESS,
                   help=f"HOST:PORT of the agent's /metrics, /healthz and /readyz; off: none (default "
                   f"%(default)s; env {METRICS_ADDR_ENV})")
    p.add_argument("--heartbeat-seconds", metavar="S", type=float, default=2.0, help="Heartbeat period (default 2)")
    p.add_argument("--stop-grace", metavar="S", type=float, default=10.0,
                   help="Seconds between SIGTERM and SIGKILL when a gang is stopped (default 10)")
    p.add_argument("--disk-pressure-below", metavar="SHARE",
                   type=float, default=float(env("CORRAL_AGENT_DISK_PRESSURE_BELOW", "0.10")),
                   help="Report DiskPressure (no new work here) while a folder the agent writes has less than "
                   "this share free (default 0.10; env CORRAL_AGENT_DISK_PRESSURE_BELOW)")
    p.add_argument("--memory-pressure-below-mib", metavar="MIB", type=float,
                   default=float(env("CORRAL_AGENT_MEMORY_PRESSURE_BELOW_MIB", "256")),
                   help="Report MemoryPressure while less memory is available (default 256; env "
                   "CORRAL_AGENT_MEMORY_PRESSURE_BELOW_MIB)")
    p.add_argument("--pressure-hold-seconds", metavar="S", type=float,
                   default=float(env("CORRAL_AGENT_PRESSURE_HOLD_SECONDS", "10")),
                   help="A pressure clears only once its measure has been back above its clear threshold "
                   "(the entry one plus half) this long (default 10; env CORRAL_AGENT_PRESSURE_HOLD_SECONDS)")
    p.add_argument("--conditions-seconds", metavar="S",
                   type=float, default=float(env("CORRAL_AGENT_CONDITIONS_SECONDS", "5")),
                   help="How often the node's conditions are measured (default 5; env "
                   "CORRAL_AGENT_CONDITIONS_SECONDS)")
    p.add_argument("--work-subjects", choices=("node", "broadcast"), default=env("CORRAL_AGENT_WORK_SUBJECTS", "node"),
                   help="Which work to consume: node, only this node's, <ns>.events.node.<node>.> (default); "
                   "broadcast, every job's events, for a control plane whose relay does not send node work yet "
                   "(docs/operations.md; env CORRAL_AGENT_WORK_SUBJECTS)")
    return p


# ---- what this process hosts -----------------------------------------------------------------

def read_cluster(path: Path) -> ClusterSpec:
    """A cluster file, or a file whose whole content is a shorthand like `4x8:H100`."""
    if not path.is_file():
        raise UsageError(f"--inventory {path}: no such file (give nvml, or a file declaring the node's GPUs)")
    try:
        return read_cluster_file(path)
    except SpecError as exc:
        raise UsageError(f"--inventory {path}: {exc}") from None


def cluster_checkpoint_dir(inventory: str) -> Path | None:
    """The shared `checkpoint_dir` of the cluster file given as `--inventory` (None: nvml, none
    declared, or not a cluster file)."""
    if inventory == NVML:
        return None
    try:
        declared = read_cluster(Path(inventory)).checkpoint_dir
    except (UsageError, OSError):
        return None
    return Path(declared) if declared else None


def model_name(nvml_name: str) -> str:
    """A contract model name from NVML's marketing name: `NVIDIA H100 80GB HBM3` -> `H100`.

    A known model among the words wins (so `gpu.model: H100` in a job spec matches); otherwise the
    words joined by '-', e.g. `GeForce-RTX-4090`.
    """
    words = [w for w in nvml_name.replace("NVIDIA", " ").split() if w]
    known = {m.upper(): m for m in GPU_MEMORY_GIB}
    for word in words:
        base = word.split("-")[0].upper()
        if base in known:
            return known[base]
    joined = "-".join(words) or "GPU"
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in joined)


def nvml_inventory(node: str, rack: str, zone: str, model: str | None) -> NodeInventory:
    found = discover(node, rack=rack, zone=zone)
    if isinstance(found, NvmlUnavailable):
        raise UsageError(f"--inventory nvml: {found.message} (to run a node without GPUs, give --inventory FILE "
                         "declaring its GPUs, e.g. a file containing 1x8:H100)")
    gpus = [GpuDevice(index=g.index, model=model or model_name(g.model),
                      memory_gib=g.memory_gib if g.memory_gib > 0 else None) for g in found.gpus]
    return NodeInventory(node=node, gpus=gpus, nvlink_domains=[list(d) for d in found.nvlink_domains],
                         rack=rack, zone=zone)


def file_inventories(path: Path, nodes: Sequence[str]) -> list[NodeInventory]:
    """The nodes declared in `path`: a cluster file (as `corral up --cluster-file`, or a shorthand
    such as `2x8:H100`) or a fake inventory (`{node, model, memory_gib, gpus}`, a list of them or
    `{nodes: [...]}`). Every node of the file, or only `nodes` when given."""
    try:
        declared = {inv.node: inv for inv in read_cluster(path).inventories()}
    except UsageError as cluster_error:
        if not path.is_file():
            raise
        try:
            fakes = load_declared_inventories(path)
        except (ValueError, TypeError, AttributeError, KeyError):
            raise cluster_error from None
        declared = {f.node: NodeInventory(
            node=f.node, gpus=[GpuDevice(index=g.index, model=g.model, memory_gib=g.memory_gib) for g in f.gpus],
            nvlink_domains=[list(d) for d in f.nvlink_domains], rack=f.rack or "rack-0", zone=f.zone or "zone-0")
            for f in fakes}
    if not nodes:
        return list(declared.values())
    unknown = [n for n in nodes if n not in declared]
    if unknown:
        raise UsageError(f"--node {', '.join(unknown)}: not in {path} (its nodes: {', '.join(declared)})")
    return [declared[n] for n in nodes]


def inventories(args: argparse.Namespace) -> list[NodeInventory]:
    """What this agent process hosts: this machine's GPUs through NVML, or the nodes a file declares."""
    nodes = list(args.node or [])
    if args.inventory != NVML:
        return file_inventories(Path(args.inventory), nodes)
    if len(nodes) > 1:
        raise UsageError("--inventory nvml runs this machine's one node: give at most one --node")
    return [nvml_inventory(nodes[0] if nodes else default_node_name(), args.rack, args.zone, args.model)]


# ---- where it connects, and what it advertises -----------------------------------------------

def nats_target(environ: Mapping[str, str]) -> tuple[str, str, str | None]:
    """(NATS URL, namespace, CA file from the context): CORRAL_NATS_URL / CORRAL_NAMESPACE first,
    then a `corral up` context file."""
    url, namespace, ca = environ.get("CORRAL_NATS_URL") or None, environ.get("CORRAL_NAMESPACE") or None, None
    if url is None:
        path = locate(None)
        if path is None:
            raise UsageError("no NATS to connect to: set CORRAL_NATS_URL (or start everything with `corral up`), "
                             "with CORRAL_NATS_CREDENTIALS and CORRAL_NATS_CA as the cluster requires")
        ctx = Context.load(path)
        url, namespace, ca = ctx.nats_url, namespace or ctx.namespace, ctx.nats_ca
    return url, namespace or DEFAULT_NAMESPACE, ca


def check_address(address: str) -> str:
    """`address` if NodeRegistered can carry it (an IP address or a DNS name), else a usage error."""
    try:
        return msgspec.convert(address, ev.Address)
    except msgspec.ValidationError:
        raise UsageError(f"--advertise-address {address!r}: not an IP address or host name") from None


def address_towards(nats_url: str) -> str:
    """The local address this host uses to reach the (first) NATS server of `nats_url`: what other
    hosts of the cluster most likely reach it at. No packet is sent (a UDP socket's route only)."""
    first = nats_url.split(",")[0].strip()
    parts = urlsplit(first if "://" in first else f"nats://{first}")
    host, port = parts.hostname, parts.port or 4222
    if not host:
        raise UsageError(f"NATS URL {nats_url!r} names no host; give --advertise-address ADDR")
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sockaddr)
            return str(s.getsockname()[0])
    except OSError as exc:
        raise UsageError(f"cannot tell which local address reaches NATS at {host}:{port} ({exc}); "
                         "give --advertise-address ADDR") from None


def advertised(flag: str | None, nats_url: str) -> str | None:
    if flag is None:
        return address_towards(nats_url)
    return None if flag.strip().lower() == NO_ADDRESS else check_address(flag)


def rendezvous_ports(flag: str) -> tuple[int, int] | None:
    """The ports registered for rendezvous; a warning on stderr when an explicit range meets the
    host's ephemeral ports."""
    if flag.strip().lower() == AUTO_PORTS:
        return local_rendezvous_ports()
    try:
        ports = parse_port_range(flag)
    except ValueError as exc:
        raise UsageError(f"--port-range: {exc}") from None
    warning = port_range_warning(ports, ephemeral_range())
    if warning is not None:
        print(f"warning: {warning}", file=sys.stderr)
    return ports


def check_identity(credentials: Path | None, nodes: Sequence[NodeInventory]) -> None:
    """An agent identity may use only the consumer of the node set it was made for (see
    `corral.bus.auth`): a mismatch would fail later as a bare NATS timeout, so say it now."""
    if credentials is None:
        return
    try:
        raw = json.loads(credentials.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"--credentials {credentials}: cannot read it ({exc})") from None
    want = f"agent-{durable_name([n.node for n in nodes])}"
    if raw.get("role") == "agent" and raw.get("user") != want:
        raise UsageError(f"--credentials {credentials} are {raw.get('user')}'s, not {want}'s (the identity of "
                         f"node(s) {', '.join(n.node for n in nodes)}): give that node's credentials, or "
                         "--node the node they were made for")


def options(args: argparse.Namespace, environ: Mapping[str, str], *,
            advertise_address: str | None = None) -> AgentOptions:
    log_dir = args.log_dir
    if log_dir is None and environ.get("CORRAL_LOG_DIR"):
        log_dir = Path(environ["CORRAL_LOG_DIR"]) / "workers"
    try:
        parse_address(args.metrics_address)
    except ValueError as exc:
        raise UsageError(f"--metrics-address: {exc}") from None
    try:
        run_as = RunAs(args.run_as) if args.run_as else RunAs.parse(environ.get(RUN_AS_ENV) or RunAs.SUBMITTER)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return AgentOptions(work_dir=args.state_dir.expanduser().resolve(), runtime=args.runtime,
                        job_log_dir=log_dir.resolve() if log_dir else None,
                        checkpoint_root=(args.checkpoint_dir.resolve() if args.checkpoint_dir
                                         else cluster_checkpoint_dir(args.inventory)),
                        heartbeat_seconds=args.heartbeat_seconds, stop_grace_seconds=args.stop_grace,
                        stop_workers_on_exit=args.stop_workers_on_exit, run_as=run_as,
                        advertise_address=advertise_address, rendezvous_ports=rendezvous_ports(args.port_range),
                        disk_pressure_below=args.disk_pressure_below,
                        memory_pressure_below_mib=args.memory_pressure_below_mib,
                        conditions_seconds=args.conditions_seconds,
                        pressure_hold_seconds=args.pressure_hold_seconds, work_subjects=args.work_subjects,
                        # this machine's GPUs: watched through NVML as they were found
                        gpu_health=args.inventory == NVML, gpu_health_seconds=min(1.0, args.heartbeat_seconds))


def main(argv: Sequence[str] | None = None, prog: str = "corral agent") -> int:
    args = parser(prog).parse_args(argv)
    try:
        url, namespace, context_ca = nats_target(environment.mapping())
        nodes = inventories(args)
        check_identity(args.credentials, nodes)
        opts = options(args, environment.mapping(), advertise_address=advertised(args.advertise_address, url))
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    environment.put(METRICS_ADDR_ENV, args.metrics_address)
    logs.configure("node-agent")  # text, or JSON lines with CORRAL_LOG_FORMAT=json
    ports = opts.rendezvous_ports
    log.info("agent for %s: advertising %s, rendezvous ports %s, state in %s", ", ".join(n.node for n in nodes),
             opts.advertise_address or "no address", f"{ports[0]}-{ports[1]}" if ports else "placement's",
             opts.work_dir)

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_agents(url, namespace, nodes, opts, stop,
                         credentials=str(args.credentials) if args.credentials else None,
                         ca=args.nats_ca or context_ca)

    with profiled("node-agents"), contextlib.suppress(KeyboardInterrupt):  # CORRAL_PROFILE_DIR: a cProfile
        asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
