"""`corral agent`: run the node agent of this host (or of fake nodes) against a cluster's NATS.

Problem: the only way to run an agent on a real machine was `python -m corral.services.node_agent
--node X --inventory nvml`, documented in a docstring, with argparse abbreviations that turned a
mistyped flag into another one; and every gang's MASTER_ADDR was 127.0.0.1, so an agent on another
host could not have rendezvoused anyway. This command is the supported way: it finds this host's
GPUs (NVML) or reads a declared inventory, advertises the address other hosts reach it at (rank 0's
node's address becomes a gang's MASTER_ADDR) and the ports it lends to rendezvous, and connects
with the same NATS URL, credentials and CA variables as the services.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
from pathlib import Path
from typing import Annotated, cast
from urllib.parse import urlsplit

import msgspec
import typer

from corral import environment
from corral.bus.naming import durable_name
from corral.cli.exit_codes import ExitCode
from corral.cli.output import err_console
from corral.cli.session import ConnectionOptions
from corral.contracts import events as ev
from corral.contracts.cluster import GpuDevice, NodeInventory
from corral.core.rendezvous import AGENT_PORT_RANGE, parse_port_range
from corral.stack.context import DEFAULT_NAMESPACE, Context, locate
from corral.telemetry import logs
from corral.telemetry.endpoint import DEFAULT_ADDRESS, METRICS_ADDR_ENV, parse_address

EXIT_USAGE = ExitCode.USAGE

NVML = "nvml"


class AgentUsageError(Exception):
    """A flag, file or environment that cannot work: one line naming it and the fix, exit 2."""


def default_node_name() -> str:
    """This host's short name as a node name (letters, digits, '.', '_', '-')."""
    short = socket.gethostname().split(".")[0]
    name = "".join(c if c.isalnum() or c in "_-" else "-" for c in short).strip("-_")
    return name or "node"


def check_address(address: str) -> str:
    """`address` if NodeRegistered can carry it (an IP address or a DNS name), else a usage error."""
    try:
        return msgspec.convert(address, ev.Address)
    except msgspec.ValidationError:
        raise AgentUsageError(f"--advertise-address {address!r}: not an IP address or host name") from None


def address_towards(nats_url: str) -> str:
    """The local address this host uses to reach the (first) NATS server of `nats_url`: what other
    hosts of the cluster most likely reach it at. No packet is sent (a UDP socket's route only)."""
    first = nats_url.split(",")[0].strip()
    parts = urlsplit(first if "://" in first else f"nats://{first}")
    host, port = parts.hostname, parts.port or 4222
    if not host:
        raise AgentUsageError(f"NATS URL {nats_url!r} names no host; give --advertise-address ADDR")
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sockaddr)
            return str(s.getsockname()[0])
    except OSError as exc:
        raise AgentUsageError(f"cannot tell which local address reaches NATS at {host}:{port} ({exc}); "
                              "give --advertise-address ADDR") from None


def _shared_checkpoints(inventory: str | None) -> Path | None:
    """The `checkpoint_dir` of the cluster file given as `--inventory` (None: none declared)."""
    from corral.services.node_agent.__main__ import cluster_checkpoint_dir

    return cluster_checkpoint_dir(Path(inventory)) if inventory and inventory != "nvml" else None


def file_inventories(path: Path, nodes: list[str]) -> list[NodeInventory]:
    """The nodes declared in `path`: a cluster file (as `corral up --cluster-file`, or a shorthand
    such as `2x8:H100`) or a fake inventory (`{node, model, memory_gib, gpus}`, a list of them or
    `{nodes: [...]}`). Every node of the file, or only `nodes` when given."""
    from corral.services.node_agent.__main__ import UsageError, read_cluster
    from corral.services.node_agent.host.inventory import load_declared_inventories

    if not path.is_file():
        raise AgentUsageError(f"--inventory {path}: no such file (give nvml, or a file declaring the node's GPUs)")
    try:
        declared = {inv.node: inv for inv in read_cluster(path).inventories()}
    except UsageError as cluster_error:
        try:
            fakes = load_declared_inventories(path)
        except (ValueError, TypeError, AttributeError, KeyError):
            raise AgentUsageError(str(cluster_error).replace("--cluster-file", "--inventory")) from None
        declared = {f.node: NodeInventory(
            node=f.node, gpus=[GpuDevice(index=g.index, model=g.model, memory_gib=g.memory_gib) for g in f.gpus],
            nvlink_domains=[list(d) for d in f.nvlink_domains], rack=f.rack or "rack-0", zone=f.zone or "zone-0")
            for f in fakes}
    if not nodes:
        return list(declared.values())
    unknown = [n for n in nodes if n not in declared]
    if unknown:
        raise AgentUsageError(f"--node {', '.join(unknown)}: not in {path} (its nodes: {', '.join(declared)})")
    return [declared[n] for n in nodes]


def host_inventories(inventory: str | None, nodes: list[str], rack: str, zone: str,
                     model: str | None) -> list[NodeInventory]:
    """What this agent process hosts: this machine's GPUs through NVML (the default when NVML finds
    any), or the nodes an inventory file declares."""
    from corral.services.node_agent.__main__ import UsageError, nvml_inventory

    if inventory is not None and inventory != NVML:
        return file_inventories(Path(inventory), nodes)
    if len(nodes) > 1:
        raise AgentUsageError("--inventory nvml runs this machine's one node: give at most one --node")
    try:
        return [nvml_inventory(nodes[0] if nodes else default_node_name(), rack, zone, model)]
    except UsageError as exc:
        hint = "" if inventory == NVML else (
            " (no GPU found here: to run a node without GPUs, give --inventory FILE declaring its GPUs, "
            "e.g. a file containing 1x8:H100)")
        raise AgentUsageError(f"{exc}{hint}") from None


def check_identity(credentials: Path | None, nodes: list[NodeInventory]) -> None:
    """An agent identity may use only the consumer of the node set it was made for (see
    `corral.bus.auth`): a mismatch would fail later as a bare NATS timeout, so say it now."""

    if credentials is None:
        return
    try:
        raw = json.loads(credentials.read_text())
    except (OSError, ValueError) as exc:
        raise AgentUsageError(f"--credentials {credentials}: cannot read it ({exc})") from None
    want = f"agent-{durable_name([n.node for n in nodes])}"
    if raw.get("role") == "agent" and raw.get("user") != want:
        raise AgentUsageError(f"--credentials {credentials} are {raw.get('user')}'s, not {want}'s (the identity of "
                              f"node(s) {', '.join(n.node for n in nodes)}): give that node's credentials, or "
                              "--node the node they were made for")


def nats_target(ca: str | None) -> tuple[str, str, str | None]:
    """(NATS URL, namespace, CA file): flags and environment first (`--nats`/CORRAL_NATS_URL,
    `--namespace`/CORRAL_NAMESPACE, `--nats-ca`/CORRAL_NATS_CA), then a `corral up` context file."""
    url, namespace = ConnectionOptions.nats, ConnectionOptions.namespace
    if url is None:
        path = locate(ConnectionOptions.context)
        if path is None:
            raise AgentUsageError("no NATS to connect to: set CORRAL_NATS_URL (or --nats URL), with "
                                  "CORRAL_NATS_CREDENTIALS and CORRAL_NATS_CA as the cluster requires")
        ctx = Context.load(path)
        url, namespace, ca = ctx.nats_url, namespace or ctx.namespace, ca or ctx.nats_ca
    return url, namespace or DEFAULT_NAMESPACE, ca


def default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/corral/agent")
    return Path(environment.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "corral" / "agent"


def register(app: typer.Typer) -> None:
    @app.command()
    def agent(
        node: Annotated[list[str] | None, typer.Option(
            "--node", help="Node name (default: this host's name). Repeatable with an inventory FILE "
                           "to run only those of its nodes (default: all of them).")] = None,
        inventory: Annotated[str | None, typer.Option(
            "--inventory", help="nvml: this machine's GPUs (the default when NVML finds any); or FILE: a "
                                "cluster file / fake inventory declaring the node's GPUs (machines without GPUs, "
                                "tests).")] = None,
        advertise_address: Annotated[str | None, typer.Option(
            "--advertise-address", envvar="CORRAL_ADVERTISE_ADDRESS",
            help="Address other hosts reach this one at; rank 0's node's address is a gang's MASTER_ADDR "
                 "(default: the local address used to reach NATS).")] = None,
        port_range: Annotated[str, typer.Option(
            "--port-range", envvar="CORRAL_RENDEZVOUS_PORTS",
            help="Ports LO-HI this host lends to rendezvous (MASTER_PORT of gangs whose rank 0 runs "
                 "here); keep them free of other services.")] = f"{AGENT_PORT_RANGE[0]}-{AGENT_PORT_RANGE[1]}",
        state_dir: Annotated[Path | None, typer.Option(
            "--state-dir", envvar="CORRAL_AGENT_STATE_DIR",
            help="Work folder: gang control files, default logs and checkpoints (default "
                 "/var/lib/corral/agent as root, else ~/.local/state/corral/agent).")] = None,
        credentials: Annotated[Path | None, typer.Option(
            "--credentials", envvar="CORRAL_NATS_CREDENTIALS",
            help="The agent's NATS credentials file (see docs/security.md).")] = None,
        nats_ca: Annotated[Path | None, typer.Option(
            "--nats-ca", envvar="CORRAL_NATS_CA", help="CA file the NATS server's certificate must chain to.")] = None,
        runtime: Annotated[str, typer.Option(
            help="process: run each job as its spec says; sim / sim-timer: simulate every job.")] = "process",
        rack: Annotated[str, typer.Option(help="Rack of an NVML node.")] = "rack-0",
        zone: Annotated[str, typer.Option(help="Zone of an NVML node.")] = "zone-0",
        model: Annotated[str | None, typer.Option(help="GPU model to report for an NVML node.")] = None,
        checkpoint_dir: Annotated[Path | None, typer.Option(
            help="Root of CORRAL_CHECKPOINT_DIR: shared storage when jobs resume on other hosts "
                 "(default <state-dir>/checkpoints).")] = None,
        log_dir: Annotated[Path | None, typer.Option(
            help="Rank logs root (default <state-dir>/logs).")] = None,
        run_as: Annotated[str | None, typer.Option(
            "--run-as", envvar="CORRAL_AGENT_RUN_AS",
            help="submitter: each job as its submitter's OS account (as root); agent: as this agent's "
                 "user.")] = None,
        stop_workers_on_exit: Annotated[bool, typer.Option(
            "--stop-workers-on-exit", envvar="CORRAL_AGENT_STOP_WORKERS_ON_EXIT",
            help="On SIGTERM stop every gang first (default: leave them for the next agent to adopt).")] = False,
        heartbeat_seconds: Annotated[float, typer.Option(help="Heartbeat period.")] = 2.0,
        metrics_address: Annotated[str, typer.Option(
            "--metrics-address", envvar=METRICS_ADDR_ENV,
            help="HOST:PORT of the agent's /metrics, /healthz and /readyz (off: none).")] = DEFAULT_ADDRESS,
    ) -> None:
        """Run this host's node agent (one per GPU host): registers the node with its GPUs, address
        and rendezvous ports, runs the ranks placement gives it, until SIGTERM / Ctrl-C."""
        from corral.services.node_agent.host.ephemeral_ports import ephemeral_range, port_range_warning
        from corral.services.node_agent.process.run_as import RunAs
        from corral.services.node_agent.reservation import AgentRuntime
        from corral.services.node_agent.service import AgentOptions, run_agents

        try:
            url, namespace, ca = nats_target(str(nats_ca) if nats_ca else None)
            nodes = host_inventories(inventory, list(node or []), rack, zone, model)
            check_identity(credentials, nodes)
            address = check_address(advertise_address) if advertise_address else address_towards(url)
            try:
                ports = parse_port_range(port_range)
            except ValueError as exc:
                raise AgentUsageError(f"--port-range: {exc}") from None
            warning = port_range_warning(ports, ephemeral_range())
            if warning is not None:
                err_console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)
            try:
                parse_address(metrics_address)
            except ValueError as exc:
                raise AgentUsageError(f"--metrics-address: {exc}") from None
            environment.put(METRICS_ADDR_ENV, metrics_address)
            if runtime not in ("process", "sim", "sim-timer"):
                raise AgentUsageError(f"--runtime {runtime!r}: use process, sim or sim-timer")
            try:
                mode = RunAs.parse(run_as or RunAs.SUBMITTER)
            except ValueError as exc:
                raise AgentUsageError(f"--run-as: {exc}") from None
            work = (state_dir or default_state_dir()).expanduser().resolve()
            options = AgentOptions(
                work_dir=work, runtime=cast(AgentRuntime, runtime),  # checked just above
                job_log_dir=log_dir.resolve() if log_dir else None,
                checkpoint_root=checkpoint_dir.resolve() if checkpoint_dir else _shared_checkpoints(inventory),
                heartbeat_seconds=heartbeat_seconds, stop_workers_on_exit=stop_workers_on_exit,
                run_as=mode, advertise_address=address, rendezvous_ports=ports,
                # this machine's GPUs: watched through NVML as they were found
                gpu_health=inventory in (None, NVML), gpu_health_seconds=min(1.0, heartbeat_seconds))
        except AgentUsageError as exc:
            err_console.print(f"[red]error:[/red] {exc}", highlight=False)
            raise SystemExit(EXIT_USAGE) from None
        logs.configure("node-agent")  # text, or JSON lines with CORRAL_LOG_FORMAT=json
        logging.getLogger("corral.agent").info(
            "agent for %s: advertising %s, rendezvous ports %d-%d, state in %s",
            ", ".join(n.node for n in nodes), address, ports[0], ports[1], work)

        async def serve() -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            await run_agents(url, namespace, nodes, options, stop,
                             credentials=str(credentials) if credentials else None, ca=ca)

        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve())


__all__ = ["address_towards", "check_address", "default_node_name", "file_inventories", "host_inventories",
           "register"]
