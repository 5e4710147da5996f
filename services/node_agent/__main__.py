"""`python -m corral.services.node_agent`: run node agents until SIGTERM/SIGINT.

Fake nodes (what `corral up` runs):
    --cluster-file F --runtime sim|sim-timer|process --work-dir D
F is a cluster file (YAML/JSON) or a file holding a shorthand such as `4x8:H100`; one agent runs
per node of F (or per `--node` chosen from it).

One real node: use `corral agent` (README, "Agents on their own hosts"), which also advertises the
host's address and rendezvous ports. Here:
    --node NAME --inventory nvml [--rack R --zone Z --model M] --work-dir D
discovers the GPUs with NVML; exits with status 2 and a clear message where NVML is absent. The
nodes it runs advertise no address: placement gives their gangs `CORRAL_MASTER_ADDR` (127.0.0.1).

Workers outlive the agent (each gang runs under its own stepd): SIGTERM/SIGINT leave them running
for the next agent to adopt (an upgrade). `--stop-workers-on-exit` (or
CORRAL_AGENT_STOP_WORKERS_ON_EXIT=1) stops them first instead, as tests that clean up need.

Whose OS user runs a job's ranks: `--run-as submitter` (the default; env CORRAL_AGENT_RUN_AS)
runs each job as the OS account named by its submitting user when the agent is root, and refuses
jobs whose user has no account here or is root in a queue without `allow_root: true`; an agent
that is not root cannot switch and runs them as itself. `--run-as agent` runs every job as the
agent's own user: a single-user box (`corral up` sets it). See docs/security.md.

Environment: CORRAL_NATS_URL (required), CORRAL_NAMESPACE (default corral), CORRAL_LOG_DIR (rank
logs go to `$CORRAL_LOG_DIR/workers/<job>/rank-<N>.log`, else `<work-dir>/logs/...`), CORRAL_LOG_LEVEL.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from corral import environment
from corral.contracts.cluster import (
    GPU_MEMORY_GIB,
    ClusterSpec,
    GpuDevice,
    NodeInventory,
    read_cluster_file,
)
from corral.contracts.problems import SpecError
from corral.profiling import profiled
from corral.telemetry import logs

from .host.ephemeral_ports import local_rendezvous_ports
from .host.inventory import NvmlUnavailable, discover
from .process.run_as import RUN_AS_ENV, RunAs
from .service import AgentOptions, run_agents

USAGE_ERROR = 2


class UsageError(Exception):
    """A bad flag, file or environment: printed without a traceback, exit status 2."""


def read_cluster(path: Path) -> ClusterSpec:
    """A cluster file, or a file whose whole content is a shorthand like `4x8:H100`."""
    if not path.is_file():
        raise UsageError(f"--cluster-file {path}: no such file")
    try:
        return read_cluster_file(path)
    except SpecError as exc:
        raise UsageError(f"--cluster-file {path}: {exc}") from None


def cluster_checkpoint_dir(path: Path | None) -> Path | None:
    """The cluster file's shared `checkpoint_dir`, the default checkpoint root (None: not declared,
    or not a cluster file)."""
    if path is None:
        return None
    try:
        declared = read_cluster(path).checkpoint_dir
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
        raise UsageError(f"--inventory nvml: {found.message}. On a machine without GPUs run fake nodes "
                         "with --cluster-file (e.g. a file containing 2x8:H100)")
    gpus = [GpuDevice(index=g.index, model=model or model_name(g.model),
                      memory_gib=g.memory_gib if g.memory_gib > 0 else None) for g in found.gpus]
    return NodeInventory(node=node, gpus=gpus, nvlink_domains=[list(d) for d in found.nvlink_domains],
                         rack=rack, zone=zone)


def inventories(args: argparse.Namespace) -> list[NodeInventory]:
    if args.inventory == "nvml":
        if not args.node or len(args.node) != 1:
            raise UsageError("--inventory nvml needs exactly one --node NAME (the machine this agent runs on)")
        if args.cluster_file is not None:
            raise UsageError("--inventory nvml discovers the GPUs itself; drop --cluster-file")
        return [nvml_inventory(args.node[0], args.rack, args.zone, args.model)]
    if args.cluster_file is None:
        raise UsageError("give --cluster-file F (fake nodes) or --node NAME --inventory nvml (a real node)")
    declared = {inv.node: inv for inv in read_cluster(args.cluster_file).inventories()}
    if not args.node:
        return list(declared.values())
    unknown = [n for n in args.node if n not in declared]
    if unknown:
        raise UsageError(f"--node {', '.join(unknown)}: not in {args.cluster_file} "
                         f"(its nodes: {', '.join(declared)})")
    return [declared[n] for n in args.node]


def parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: an unknown flag is an error, never silently another one (`--cluster`
    # became `--cluster-file` and the agent exited 2 and restarted forever).
    p = argparse.ArgumentParser(prog="python -m corral.services.node_agent", allow_abbrev=False,
                                description="Run Corral node agents (one per node). On a real host "
                                "use `corral agent` (see the README).")
    p.add_argument("--cluster-file", type=Path, help="cluster file (YAML/JSON) or a file holding a "
                   "shorthand such as 4x8:H100; one agent per node")
    p.add_argument("--node", action="append", help="run only this node (repeatable); required with nvml")
    p.add_argument("--inventory", choices=("declared", "nvml"), default="declared",
                   help="declared: from --cluster-file (default); nvml: discover this machine's GPUs")
    p.add_argument("--rack", default="rack-0", help="rack of an nvml node (default rack-0)")
    p.add_argument("--zone", default="zone-0", help="zone of an nvml node (default zone-0)")
    p.add_argument("--model", help="model name to report for an nvml node's GPUs (default: from NVML)")
    p.add_argument("--runtime", choices=("sim", "sim-timer", "process"), default="process",
                   help="process: run each job as its spec says (default); sim: simulate every job; "
                   "sim-timer: simulate every job as a timer inside the agent (no process per rank)")
    p.add_argument("--work-dir", type=Path, default=Path(".corral/nodes"),
                   help="control files and, by default, checkpoints and logs (default .corral/nodes)")
    p.add_argument("--checkpoint-dir", type=Path, help="root of CORRAL_CHECKPOINT_DIR (default: the cluster "
                   "file's checkpoint_dir, else <work-dir>/checkpoints; use shared storage across machines)")
    p.add_argument("--log-dir", type=Path, help="rank logs root (default $CORRAL_LOG_DIR/workers, else "
                   "<work-dir>/logs)")
    p.add_argument("--heartbeat-seconds", type=float, default=2.0, help="heartbeat period (default 2)")
    p.add_argument("--stop-grace", type=float, default=10.0,
                   help="seconds between SIGTERM and SIGKILL when a gang is stopped (default 10)")
    p.add_argument("--stop-workers-on-exit", action="store_true",
                   default=(environment.get("CORRAL_AGENT_STOP_WORKERS_ON_EXIT") or "") not in ("", "0", "false"),
                   help="on SIGTERM/SIGINT stop every gang first (default: leave them running for the next "
                   "agent to adopt; env CORRAL_AGENT_STOP_WORKERS_ON_EXIT=1)")
    p.add_argument("--disk-pressure-below", type=float,
                   default=float(environment.get("CORRAL_AGENT_DISK_PRESSURE_BELOW") or "0.10"),
                   help="report DiskPressure (no new work here) while a folder the agent writes has less than "
                   "this share free (default 0.10; env CORRAL_AGENT_DISK_PRESSURE_BELOW)")
    p.add_argument("--memory-pressure-below-mib", type=float,
                   default=float(environment.get("CORRAL_AGENT_MEMORY_PRESSURE_BELOW_MIB") or "256"),
                   help="report MemoryPressure while less memory is available (default 256; env "
                   "CORRAL_AGENT_MEMORY_PRESSURE_BELOW_MIB)")
    p.add_argument("--pressure-hold-seconds", type=float,
                   default=float(environment.get("CORRAL_AGENT_PRESSURE_HOLD_SECONDS") or "10"),
                   help="a pressure clears only once its measure has been back above its clear threshold "
                   "(the entry one plus half) this long (default 10; env CORRAL_AGENT_PRESSURE_HOLD_SECONDS)")
    p.add_argument("--conditions-seconds", type=float,
                   default=float(environment.get("CORRAL_AGENT_CONDITIONS_SECONDS") or "5"),
                   help="how often the node's conditions are measured (default 5; env "
                   "CORRAL_AGENT_CONDITIONS_SECONDS)")
    p.add_argument("--run-as", choices=[m.value for m in RunAs], default=None,
                   help="submitter: run each job as its submitting user's OS account when this agent is root "
                   "(default); agent: run every job as this agent's user (a single-user box; `corral up`). "
                   f"Env {RUN_AS_ENV}")
    p.add_argument("--work-subjects", choices=("node", "broadcast"),
                   default=environment.get("CORRAL_AGENT_WORK_SUBJECTS") or "node",
                   help="node: consume only this node's work, <ns>.events.node.<node>.> (default); broadcast: "
                   "every job's events, for a control plane whose relay does not send node work yet "
                   "(docs/operations.md; env CORRAL_AGENT_WORK_SUBJECTS)")
    return p


def options(args: argparse.Namespace, environ: Mapping[str, str]) -> AgentOptions:
    log_dir = args.log_dir
    if log_dir is None and environ.get("CORRAL_LOG_DIR"):
        log_dir = Path(environ["CORRAL_LOG_DIR"]) / "workers"
    try:
        run_as = RunAs(args.run_as) if args.run_as else RunAs.parse(environ.get(RUN_AS_ENV) or RunAs.SUBMITTER)
        return AgentOptions(work_dir=args.work_dir.resolve(), runtime=args.runtime,
                            job_log_dir=log_dir.resolve() if log_dir else None,
                            checkpoint_root=(args.checkpoint_dir.resolve() if args.checkpoint_dir
                                             else cluster_checkpoint_dir(args.cluster_file)),
                            heartbeat_seconds=args.heartbeat_seconds, stop_grace_seconds=args.stop_grace,
                            stop_workers_on_exit=args.stop_workers_on_exit, run_as=run_as,
                            disk_pressure_below=args.disk_pressure_below,
                            memory_pressure_below_mib=args.memory_pressure_below_mib,
                            conditions_seconds=args.conditions_seconds,
                            pressure_hold_seconds=args.pressure_hold_seconds, work_subjects=args.work_subjects,
                            gpu_health=args.inventory == "nvml",
                            gpu_health_seconds=min(1.0, args.heartbeat_seconds),
                            # every node here shares this host's ports (`ephemeral_ports`)
                            rendezvous_ports=local_rendezvous_ports())
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logs.configure("node-agent")  # text, or JSON lines with CORRAL_LOG_FORMAT=json
    try:
        url = environment.get("CORRAL_NATS_URL")
        if not url:
            raise UsageError("set CORRAL_NATS_URL (or start everything with `corral up`)")
        nodes = inventories(args)
        opts = options(args, environment.mapping())
    except UsageError as exc:
        print(f"node agent: {exc}", file=sys.stderr)
        return USAGE_ERROR
    namespace = environment.get("CORRAL_NAMESPACE") or "corral"

    async def _main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_agents(url, namespace, nodes, opts, stop)

    with profiled("node-agents"):  # CORRAL_PROFILE_DIR: a cProfile of the whole run
        asyncio.run(_main())
    return 0


if __name__ == "__main__":
    sys.exit(main())
