"""`corral agent ARGS`: the node agent's own entry point (`python -m corral.services.node_agent`),
which holds every option and the help; this command has none of its own.

The process becomes the agent (exec: the same pid, for systemd and containers), so a short command
such as `corral jobs` never imports the daemon. Where the cluster is, given to `corral` itself
(`--nats`, `--namespace`, `--context`), reaches the agent as its environment.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

import typer

from corral import environment
from corral.cli.session import ConnectionOptions

AGENT_MODULE = "corral.services.node_agent"


def agent_argv(args: Sequence[str]) -> list[str]:
    """The command line the agent runs as."""
    return [sys.executable, "-m", AGENT_MODULE, *args]


def agent_env(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with the connection `corral`'s own options named."""
    named = {"CORRAL_NATS_URL": ConnectionOptions.nats, "CORRAL_NAMESPACE": ConnectionOptions.namespace,
             "CORRAL_CONTEXT": str(ConnectionOptions.context) if ConnectionOptions.context else None}
    return {**environ, **{k: v for k, v in named.items() if v}}


def register(app: typer.Typer) -> None:
    @app.command(add_help_option=False, context_settings={
        "allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []})
    def agent(ctx: typer.Context) -> None:
        """Run this host's node agent (one per GPU host): registers the node with its GPUs, address and
        rendezvous ports, and runs the ranks placement gives it, until SIGTERM / Ctrl-C. Its options:
        `corral agent --help`."""
        argv = agent_argv(ctx.args)
        os.execve(argv[0], argv, agent_env(environment.mapping()))


__all__ = ["AGENT_MODULE", "agent_argv", "agent_env", "register"]
