"""The `corral` command: what a person at a terminal (and a script) uses.

Why one entry point: like kubectl or Slurm's s* commands, every verb finds the cluster the same way
(flags, environment, then the context file that `corral up` wrote) and prints a table or `--json`.
Exit codes: 0 ok, 1 failure of the request (bad spec, unknown job), 2 usage error, 3 no cluster.
"""

from __future__ import annotations

import importlib
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated

import typer

from corral.cli.output import console, err_console, fail, print_json, print_table
from corral.cli.session import ConnectionOptions

_app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Corral: a GPU scheduler and cluster orchestrator.")


@_app.callback()
def _connection(
    nats: Annotated[str | None, typer.Option("--nats", envvar="CORRAL_NATS_URL",
                                             help="NATS URL of the cluster; several (a NATS cluster) "
                                                  "separated by commas.")] = None,
    postgres: Annotated[str | None, typer.Option("--postgres", envvar="CORRAL_POSTGRES_DSN",
                                                 help="Postgres DSN of the cluster's event log.")] = None,
    namespace: Annotated[str | None, typer.Option("--namespace", envvar="CORRAL_NAMESPACE")] = None,
    context: Annotated[Path | None, typer.Option(
        "--context", envvar="CORRAL_CONTEXT",
        help="The cluster's context.json, or the data folder holding it (default: the nearest "
             ".corral/context.json in this folder or its parents).")] = None,
) -> None:
    """Where the cluster is: flags, then environment, then the context file `corral up` wrote."""
    ConnectionOptions.nats, ConnectionOptions.postgres, ConnectionOptions.namespace = nats, postgres, namespace
    ConnectionOptions.context = context


@_app.command()
def up(
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Where servers keep their state.")] = Path(".corral"),
    cluster: Annotated[str | None, typer.Option(help="Shorthand NODESxGPUS:MODEL, e.g. 4x8:H100.")] = None,
    cluster_file: Annotated[Path | None, typer.Option(help="A cluster file (YAML/JSON).")] = None,
    nats: Annotated[str | None, typer.Option("--nats", help="Use this external NATS instead of starting one.")] = None,
    postgres: Annotated[str | None, typer.Option("--postgres", help="Use this external Postgres.")] = None,
    namespace: Annotated[str | None, typer.Option(help="Subject/stream prefix (default corral).")] = None,
    runtime: Annotated[str, typer.Option(
        help="Worker runtime of the simulated nodes: process (runs each job's command), sim (a process per "
             "rank that sleeps the job's duration_seconds) or sim-timer (no process: a timer inside the "
             "agent, for large simulated clusters).")] = "process",
    replicas: Annotated[int | None, typer.Option(
        "--replicas", envvar="CORRAL_STREAM_REPLICAS", min=1, max=5,
        help="Servers holding each JetStream stream: 1 (the default) with the nats-server `corral up` "
             "starts; 3 with --nats listing a 3-node cluster.")] = None,
    agents: Annotated[str, typer.Option(
        "--agents", help="simulated: node agents for the --cluster nodes on this machine (the dev cluster); "
                         "none: the control plane only, GPU hosts run `corral agent`.")] = "simulated",
    agent_node: Annotated[list[str] | None, typer.Option(
        "--agent-node", help="A node whose agent runs elsewhere (`corral agent --node NAME`); repeatable. Each "
                             "gets NATS credentials <data-dir>/credentials/agent-node-agent-NAME.json.")] = None,
    listen: Annotated[str, typer.Option(
        "--listen", help="Address of this host the NATS and Postgres `corral up` starts listen on (0.0.0.0: all): "
                         "agents and CLIs on other hosts reach them there.")] = "127.0.0.1",
    advertise_address: Annotated[str | None, typer.Option(
        "--advertise-address", help="Address or host name clients are given for those servers (default: "
                                    "the --listen address; with 0.0.0.0, this host's name).")] = None,
    policy: Annotated[str, typer.Option(
        "--policy", envvar="CORRAL_POLICY",
        help="The scheduling policy quota, placement and preemption decide by (as `corral sim --policy`): "
             "corral, fair-las, fifo, priority, backfill or las.")] = "corral",
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Start NATS, Postgres, the five services and simulated node agents, and keep them running
    (a dead one is restarted with backoff). Ctrl-C (or SIGTERM) stops all in order, placement
    first, leaving jobs as they are: the next `corral up` continues them. `--agents none` runs the
    control plane only (as `corral server`)."""
    from corral.cluster_ready import wait_for_nodes
    from corral.stack.lock import AlreadyRunning
    from corral.stack.up import Agents, Stack, StackOptions

    nats = nats or ConnectionOptions.nats
    postgres = postgres or ConnectionOptions.postgres
    ns: str = namespace or ConnectionOptions.namespace or "corral"
    started = time.monotonic()
    try:
        mode = Agents(agents)
    except ValueError:
        raise typer.BadParameter(f"--agents {agents!r}: use simulated or none") from None
    from corral.core.model import POLICIES

    if policy not in POLICIES:
        raise typer.BadParameter(f"--policy {policy!r}: choose one of {', '.join(POLICIES)}")
    stack = Stack(StackOptions(data_dir=data_dir, cluster=cluster, cluster_file=cluster_file, nats_url=nats,
                               postgres_dsn=postgres, namespace=ns, runtime=runtime,
                               stream_replicas=replicas, agents=mode, agent_nodes=tuple(agent_node or ()),
                               listen=listen, advertise=advertise_address,
                               extra_env={"CORRAL_POLICY": policy}),
                  say=lambda message: err_console.print(message, highlight=False))
    signal.signal(signal.SIGTERM, _interrupt)  # a SIGTERM while starting stops what started, too
    try:
        ctx = stack.start()
        nodes = wait_for_nodes(ctx, stack, timeout=30.0)
    except AlreadyRunning as exc:
        fail(str(exc))
        return
    except KeyboardInterrupt:
        err_console.print("interrupted while starting; stopping…")
        stack.stop()
        raise SystemExit(130) from None
    except Exception as exc:
        stack.stop()
        fail(f"corral up failed: {exc}")
        return
    stopping = _StopRequest()  # from here a signal asks for the ordered stop, never cuts it short
    elapsed = time.monotonic() - started
    if json_out:
        print_json({"nats": ctx.nats_url, "nats_ca": ctx.nats_ca, "postgres": ctx.postgres_dsn,
                    "namespace": ctx.namespace,
                    "data_dir": ctx.data_dir, "started_in_seconds": round(elapsed, 2),
                    "processes": [{"name": p.name, "pid": p.pid, "metrics": p.metrics_url} for p in stack.processes],
                    "servers": [{"name": name, "pid": server.proc.pid}
                                for name, server in (("nats", stack.nats), ("postgres", stack.postgres))
                                if server is not None and server.proc is not None],
                    "listen": listen if stack.nats or stack.postgres else None,
                    "join": [j.as_json() for j in stack.join_commands()],
                    "gateway": ctx.gateway,
                    "nodes": nodes,
                    "ports_moved": {name: {"was": then, "now": now}
                                    for name, (then, now) in stack.moved_ports.items()}})
    else:
        console.print(f"[bold green]Corral is up[/bold green] in {elapsed:.1f}s  (data: {ctx.data_dir})")
        print_table(None, ["COMPONENT", "WHERE"], [
            ("nats (JetStream)", ctx.nats_url + ("" if stack.nats else "  (external)")),
            ("postgres", ctx.postgres_dsn.partition("?")[0] + ("" if stack.postgres else "  (external)")),
            *[(p.name, f"pid {p.pid}  log {p.log_path}") for p in stack.processes],
        ])
        print_table("telemetry: /metrics, /healthz, /readyz", ["PROCESS", "ENDPOINT"], [
            (p.name, p.metrics_url) for p in stack.processes if p.metrics_url
        ])
        print_table(f"{len(nodes)} nodes registered", ["NODE", "GPUS", "MODEL", "RACK"],
                    [(n["name"], n["gpus"], n["model"], n["rack"]) for n in nodes])
        console.print(where_commands_find(Path(ctx.data_dir or data_dir)), highlight=False)
        if ctx.gateway:
            console.print(f"Other people of this host submit as their own account: "
                          f"CORRAL_CONTEXT={Path(ctx.gateway).parent} corral submit FILE", highlight=False)
        _print_joins(stack, listen)
        console.print("Ctrl-C stops everything.")
    _run_until_interrupted(stack, stopping)


@_app.command()
def server(
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Where servers keep their state.")] = Path(".corral"),
    nats: Annotated[str | None, typer.Option("--nats", help="Use this external NATS instead of starting one.")] = None,
    postgres: Annotated[str | None, typer.Option("--postgres", help="Use this external Postgres.")] = None,
    namespace: Annotated[str | None, typer.Option(help="Subject/stream prefix (default corral).")] = None,
    agent_node: Annotated[list[str] | None, typer.Option(
        "--agent-node", help="A node whose agent runs elsewhere (`corral agent --node NAME`); repeatable.")] = None,
    listen: Annotated[str, typer.Option(
        "--listen", help="Address of this host its own NATS and Postgres listen on (0.0.0.0: all).")] = "127.0.0.1",
    advertise_address: Annotated[str | None, typer.Option(
        "--advertise-address", help="Address or host name clients are given (default: --listen's).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """The control plane only: NATS, Postgres and the services, no node agents (`corral up --agents
    none`). Each GPU host runs `corral agent` (the printed join command: --listen ADDR first)."""
    up(data_dir=data_dir, cluster=None, cluster_file=None, nats=nats, postgres=postgres, namespace=namespace,
       runtime="process", agents="none", agent_node=agent_node, listen=listen, advertise_address=advertise_address,
       json_out=json_out)


def _print_joins(stack: object, listen: str) -> None:
    """Each `--agent-node`'s join command (the files to copy to its host, the line to run there)."""
    from corral.stack.join import is_loopback
    from corral.stack.up import Stack

    assert isinstance(stack, Stack)
    joins = stack.join_commands()
    if not joins:
        return
    where = " (they listen on loopback: from this machine only; `--listen ADDR` for other hosts)" \
        if is_loopback(listen) else ""
    console.print(f"Agents join from their hosts{where}: copy the files there, then run the line.", highlight=False)
    for j in joins:
        console.print(f"  {j.node}:", highlight=False)
        for here, there in j.copy:
            console.print(f"    copy {here} to {there}", highlight=False, soft_wrap=True)
        console.print(f"    run  {j.shell()}", highlight=False, soft_wrap=True)


def where_commands_find(data_dir: Path) -> str:
    """The line `corral up` prints about its context: which folder's commands reach this cluster."""
    here = Path.cwd().resolve()
    if data_dir.resolve() == (here / ".corral").resolve():
        return f"Context: .corral/context.json. `corral` commands run in {here} (or below) reach this cluster."
    return (f"Context: {data_dir}/context.json. Other commands reach this cluster with "
            f"`corral --context {data_dir} ...` (or CORRAL_CONTEXT={data_dir}).")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


class _StopRequest:
    """Set by Ctrl-C / SIGTERM once the stack is up (handlers installed on creation)."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGINT, self._request)
        signal.signal(signal.SIGTERM, self._request)

    def _request(self, signum: int, frame: object) -> None:
        if self.requested:
            err_console.print("already stopping: placement first, node agents last; please wait")
        self.requested = True


def _run_until_interrupted(stack: object, stopping: _StopRequest) -> None:
    """Supervise until Ctrl-C / SIGTERM, then stop in order. A second Ctrl-C does not cut the
    ordered stop short (each phase has its own deadline)."""
    from corral.stack.up import Stack

    assert isinstance(stack, Stack)
    try:
        while not stopping.requested:
            stack.supervise()
            time.sleep(0.25)
    finally:
        err_console.print("stopping: placement and preemption first, then quota and admission, node agents, "
                          "servers; jobs stay as they are in the log…")
        stack.stop()
        err_console.print("stopped.")


#: Each command's module and the function that registers it, in the order `corral --help` lists
#: them. A command run by name imports only its own module (and what that imports): `corral jobs`
#: never loads NATS, the scheduling core's policies or `corral up`'s stack. Without a known command
#: (`corral --help`, a typo) every module is registered.
REGISTRARS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("jobs", "register", ("submit", "jobs", "show", "cancel", "why")),
    ("logs", "register", ("logs",)),
    ("agent", "register", ("agent",)),
    ("cluster", "register", ("nodes", "queues", "apply", "events", "replay")),
    ("tools", "register", ("validate", "schemas")),
    ("tools", "register_sim", ("sim",)),
    ("demo", "register", ("demo",)),
    ("dlq", "register", ("dlq",)),
    ("audit", "register", ("audit",)),
    ("service", "register", ("service", "healthcheck")),
    ("operator", "register", ("hold", "release", "requeue", "drain", "undrain")),
    ("gpu", "register", ("gpu",)),
    ("credentials", "register", ("credentials",)),
    ("observe", "register", ("usage", "top")),
    ("people", "register", ("whoami", "user")),
)
#: The top-level options that take a value (the callback's): skipped when finding the command.
_VALUED_OPTIONS = ("--nats", "--postgres", "--namespace", "--context")
_registered: set[tuple[str, str]] = set()


def _register(module: str, function: str) -> None:
    if (module, function) not in _registered:
        _registered.add((module, function))
        getattr(importlib.import_module(f"corral.cli.{module}"), function)(_app)


def command_name(args: Sequence[str]) -> str | None:
    """The command `args` (argv without the program) runs, or None (none given: help or usage)."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in _VALUED_OPTIONS:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def register_for(args: Sequence[str]) -> typer.Typer:
    """The app with the commands `args` may run: only its command's module when it names one."""
    name = command_name(args)
    chosen = [(m, f) for m, f, names in REGISTRARS if name in names]
    if not chosen and name not in ("up", "server"):  # defined here
        chosen = [(m, f) for m, f, _ in REGISTRARS]
    for module, function in chosen:
        _register(module, function)
    return _app


def __getattr__(name: str) -> typer.Typer:
    """`corral.cli.main.app`: the app with every command (tests, `typer`'s own tools)."""
    if name == "app":
        for module, function, _ in REGISTRARS:
            _register(module, function)
        return _app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _command_key(info: typer.models.CommandInfo) -> str:
    return info.name or (info.callback.__name__.replace("_", "-") if info.callback else "")


def only(app: typer.Typer, name: str | None) -> Callable[[], None]:
    """Run `app` with only the command `name` (when it has it): typer builds every registered
    command on each call, evaluating each one's annotations (~10 ms a command), and the others of
    its module are not run. Their lists are put back afterwards."""
    commands, groups = app.registered_commands, app.registered_groups
    mine = [c for c in commands if _command_key(c) == name]
    theirs = [g for g in groups if g.name == name]

    def run() -> None:
        if mine or theirs:
            app.registered_commands, app.registered_groups = mine, theirs
        try:
            app()
        finally:
            app.registered_commands, app.registered_groups = commands, groups

    return run


def main() -> None:
    try:
        args = sys.argv[1:]
        only(register_for(args), command_name(args))()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
