"""The `corral` command: what a person at a terminal (and a script) uses.

Why one entry point: like kubectl or Slurm's s* commands, every verb finds the cluster the same way
(flags, environment, then the context file that `corral up` wrote) and prints a table or `--json`.
Exit codes: 0 ok, 1 failure of the request (bad spec, unknown job), 2 usage error, 3 no cluster.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from corral.cli import audit, cluster, demo, jobs, tools
from corral.cli.output import console, fail, print_json, print_table
from corral.cli.session import ConnectionOptions

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Corral: a GPU scheduler and cluster orchestrator.")


@app.callback()
def _connection(
    nats: Annotated[str | None, typer.Option("--nats", envvar="CORRAL_NATS_URL",
                                             help="NATS URL of the cluster.")] = None,
    postgres: Annotated[str | None, typer.Option("--postgres", envvar="CORRAL_POSTGRES_DSN",
                                                 help="Postgres DSN of the cluster's event log.")] = None,
    namespace: Annotated[str | None, typer.Option("--namespace", envvar="CORRAL_NAMESPACE")] = None,
) -> None:
    """Where the cluster is: flags, then environment, then the context file `corral up` wrote."""
    ConnectionOptions.nats, ConnectionOptions.postgres, ConnectionOptions.namespace = nats, postgres, namespace


@app.command()
def up(
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Where servers keep their state.")] = Path(".corral"),
    cluster: Annotated[str | None, typer.Option(help="Shorthand NODESxGPUS:MODEL, e.g. 4x8:H100.")] = None,
    cluster_file: Annotated[Path | None, typer.Option(help="A cluster file (YAML/JSON).")] = None,
    nats: Annotated[str | None, typer.Option("--nats", help="Use this external NATS instead of starting one.")] = None,
    postgres: Annotated[str | None, typer.Option("--postgres", help="Use this external Postgres.")] = None,
    namespace: Annotated[str | None, typer.Option(help="Subject/stream prefix (default corral).")] = None,
    runtime: Annotated[str, typer.Option(help="Worker runtime of the simulated nodes: sim or process.")] = "process",
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Start NATS, Postgres, the five services and simulated node agents; Ctrl-C stops all."""
    from corral.stack.ready import wait_for_nodes
    from corral.stack.up import Stack, StackOptions

    nats = nats or ConnectionOptions.nats
    postgres = postgres or ConnectionOptions.postgres
    ns: str = namespace or ConnectionOptions.namespace or "corral"
    started = time.monotonic()
    stack = Stack(StackOptions(data_dir=data_dir, cluster=cluster, cluster_file=cluster_file, nats_url=nats,
                               postgres_dsn=postgres, namespace=ns, runtime=runtime))
    try:
        ctx = stack.start()
        nodes = wait_for_nodes(ctx, stack, timeout=30.0)
    except Exception as exc:
        stack.stop()
        fail(f"corral up failed: {exc}")
        return
    elapsed = time.monotonic() - started
    if json_out:
        print_json({"nats": ctx.nats_url, "postgres": ctx.postgres_dsn, "namespace": ctx.namespace,
                    "data_dir": ctx.data_dir, "started_in_seconds": round(elapsed, 2),
                    "processes": [{"name": p.name, "pid": p.pid} for p in stack.processes],
                    "nodes": nodes})
    else:
        console.print(f"[bold green]Corral is up[/bold green] in {elapsed:.1f}s  (data: {ctx.data_dir})")
        print_table(None, ["COMPONENT", "WHERE"], [
            ("nats (JetStream)", ctx.nats_url + ("" if stack.nats else "  (external)")),
            ("postgres", ctx.postgres_dsn + ("" if stack.postgres else "  (external)")),
            *[(p.name, f"pid {p.pid}  log {p.log_path}") for p in stack.processes],
        ])
        print_table(f"{len(nodes)} nodes registered", ["NODE", "GPUS", "MODEL", "RACK"],
                    [(n["name"], n["gpus"], n["model"], n["rack"]) for n in nodes])
        console.print("Context written: other `corral` commands find this cluster. Ctrl-C stops everything.")
    _run_until_interrupted(stack)


def _run_until_interrupted(stack: object) -> None:
    from corral.stack.up import Stack

    assert isinstance(stack, Stack)
    stopping = False

    def _stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    try:
        while not stopping:
            for p in stack.dead():
                console.print(f"[yellow]{p.name} exited; restarting it[/yellow]")
                p.start()
            time.sleep(0.5)
    finally:
        console.print("stopping…")
        stack.stop()
        console.print("stopped.")


jobs.register(app)
cluster.register(app)
tools.register(app)
tools.register_sim(app)
demo.register(app)
audit.register(app)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
