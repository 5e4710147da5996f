"""`corral service NAME` and `corral healthcheck`: what containers and units run.

The problem: docker-compose, the Kubernetes manifests and the systemd units ran
`python -m corral.services.<name>`, a module path no `--help` lists and no check could verify;
the deploy files now run `corral service placement` (and `corral agent` on each GPU host), and
probe a process with `corral healthcheck` (see `corral.health`).
"""

from __future__ import annotations

import os
import runpy
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from corral.cli.session import ConnectionOptions


class ServiceName(StrEnum):
    """The control-plane services; run two `placement` for a standby (it waits for the lease)."""

    ADMISSION = "admission"
    QUOTA = "quota"
    PLACEMENT = "placement"
    PREEMPTION = "preemption"


def register(app: typer.Typer) -> None:
    @app.command("service")
    def service(name: Annotated[ServiceName, typer.Argument(help="Which service to run.")]) -> None:
        """Run one control-plane service until SIGTERM. Needs CORRAL_NATS_URL (several servers
        separated by commas) and CORRAL_POSTGRES_DSN (or --nats/--postgres); optional:
        CORRAL_NAMESPACE, CORRAL_NATS_CREDENTIALS, CORRAL_NATS_CA, CORRAL_STREAM_REPLICAS,
        CORRAL_HEALTH_FILE. A second `placement` is a standby: it takes over when the first dies."""
        for var, value in (("CORRAL_NATS_URL", ConnectionOptions.nats),
                           ("CORRAL_POSTGRES_DSN", ConnectionOptions.postgres),
                           ("CORRAL_NAMESPACE", ConnectionOptions.namespace)):
            if value:
                os.environ[var] = value
        runpy.run_module(f"corral.services.{name.value}", run_name="__main__", alter_sys=True)

    @app.command("healthcheck")
    def healthcheck(
        file: Annotated[Path, typer.Option("--file", envvar="CORRAL_HEALTH_FILE",
                                           help="The file the process touches (its CORRAL_HEALTH_FILE).")],
        max_age: Annotated[float, typer.Option("--max-age", help="Healthy if touched within this many seconds.")
                           ] = 30.0,
    ) -> None:
        """Exit 0 if the process behind FILE is alive and connected to NATS, 1 otherwise (a probe)."""
        from corral.health import fresh

        if not fresh(file, max_age):
            typer.echo(f"unhealthy: {file} not touched within {max_age:g}s", err=True)
            raise typer.Exit(1)
