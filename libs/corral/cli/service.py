"""`corral service NAME` and `corral healthcheck`: what containers and units run.

Why: docker-compose, the Kubernetes manifests and the systemd units need an entry point that
`--help` lists and a check can verify, not a module path: they run `corral service placement` (and
`corral agent` on each GPU host), and probe a process with `corral healthcheck --url /healthz` (its
own `/healthz`, where a probe must be a command) or `--file` (the health file; see `corral.health`).
"""

from __future__ import annotations

import runpy
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from corral import environment
from corral.cli.session import ConnectionOptions
from corral.telemetry.endpoint import DEFAULT_ADDRESS, METRICS_ADDR_ENV, parse_address


class ServiceName(StrEnum):
    """The control-plane services; run two `placement` for a standby (it waits for the lease).
    `gateway`: the local gateway of a login node (people submit as their OS account; its socket
    is CORRAL_GATEWAY, default /run/corral-gateway/gateway.sock)."""

    ADMISSION = "admission"
    QUOTA = "quota"
    PLACEMENT = "placement"
    PREEMPTION = "preemption"
    GATEWAY = "gateway"


def register(app: typer.Typer) -> None:
    @app.command("service")
    def service(
        name: Annotated[ServiceName, typer.Argument(help="Which service to run.")],
        metrics_address: Annotated[str, typer.Option(
            "--metrics-address", envvar=METRICS_ADDR_ENV,
            help="HOST:PORT of the service's /metrics, /healthz and /readyz (off: none).")] = DEFAULT_ADDRESS,
    ) -> None:
        """Run one control-plane service until SIGTERM. Needs CORRAL_NATS_URL (several servers
        separated by commas) and CORRAL_POSTGRES_DSN (or --nats/--postgres); optional:
        CORRAL_NAMESPACE, CORRAL_NATS_CREDENTIALS, CORRAL_NATS_CA, CORRAL_STREAM_REPLICAS,
        CORRAL_HEALTH_FILE, CORRAL_LOG_FORMAT=json. A second `placement` is a standby: it takes over
        when the first dies."""
        try:
            parse_address(metrics_address)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--metrics-address") from None
        environment.put(METRICS_ADDR_ENV, metrics_address)
        for var, value in (("CORRAL_NATS_URL", ConnectionOptions.nats),
                           ("CORRAL_POSTGRES_DSN", ConnectionOptions.postgres),
                           ("CORRAL_NAMESPACE", ConnectionOptions.namespace)):
            if value:
                environment.put(var, value)
        runpy.run_module(f"corral.services.{name.value}", run_name="__main__", alter_sys=True)

    @app.command("healthcheck")
    def healthcheck(
        file: Annotated[Path | None, typer.Option("--file", envvar="CORRAL_HEALTH_FILE",
                                                  help="The file the process touches (its CORRAL_HEALTH_FILE).")
                        ] = None,
        max_age: Annotated[float, typer.Option("--max-age", help="Healthy if touched within this many seconds.")
                           ] = 30.0,
        url: Annotated[str | None, typer.Option(
            "--url", help="Ask the process's endpoint instead: http://HOST:PORT/PATH, or a path (/healthz, "
                          "/readyz) on this host at CORRAL_METRICS_ADDR.")] = None,
    ) -> None:
        """Exit 0 if the process is healthy, 1 otherwise (a probe): with --url, its endpoint answers
        200; else the process behind FILE is alive and connected to NATS."""
        from corral.health import endpoint_url, fresh, probe_url

        if url is not None:
            try:
                target = endpoint_url(url, environment.get(METRICS_ADDR_ENV))
            except ValueError as exc:
                raise typer.BadParameter(str(exc), param_hint="--url") from None
            healthy, seen = probe_url(target, timeout=max(1.0, min(max_age, 10.0)))
            if not healthy:
                typer.echo(f"unhealthy: {seen}", err=True)
                raise typer.Exit(1)
            return
        if file is None:
            raise typer.BadParameter("give --url (the process's /healthz) or --file (its CORRAL_HEALTH_FILE)",
                                     param_hint="--file")
        if not fresh(file, max_age):
            typer.echo(f"unhealthy: {file} not touched within {max_age:g}s", err=True)
            raise typer.Exit(1)
