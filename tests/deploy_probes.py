"""The deploy files' probes and scrape targets point at a port and a path the process serves.

Why: a probe or a Prometheus target names a port and a path by hand, while the process
listens where `--metrics-address` or `CORRAL_METRICS_ADDR` says (default 0.0.0.0:9464) and answers
three paths (`corral.telemetry.endpoint.PATHS`). A manifest with `port: 9465` or `/health`
validates against every schema, and then Kubernetes restarts the pod forever (or never sends it
traffic), compose marks the container unhealthy, and Prometheus scrapes nothing. The checks here
compute the port each process serves from its own command and environment and compare:

- `served_port`: the port of `corral service ...` / `corral agent ...` (None: it serves nothing);
- `container_problems` (Kubernetes): each `httpGet`/`tcpSocket` probe (a named port resolved
  through the container's `ports`), each `corral healthcheck --url` probe, each declared
  container port and the pod's `prometheus.io/port`/`path` annotations;
- `compose_service_problems`: the `corral healthcheck --url` healthcheck and the published ports;
- `prometheus_compose_problems`: the compose job's targets are exactly the compose services at
  their ports;
- `systemd_port_problems`: the units and drop-ins give every process of a host its own port.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from corral.health import endpoint_url
from corral.telemetry.endpoint import DEFAULT_ADDRESS, METRICS_ADDR_ENV, PATHS, parse_address

PROBES = ("startupProbe", "livenessProbe", "readinessProbe")
LOCAL = ("127.0.0.1", "localhost", "::1")


def serves(argv: Sequence[str]) -> bool:
    """Whether `argv` runs a process with a telemetry endpoint (`corral service`, `corral agent`)."""
    args = [a for a in argv[1:] if not a.startswith("-")]
    return bool(argv) and Path(argv[0]).name == "corral" and bool(args) and args[0] in ("service", "agent")


def served_port(argv: Sequence[str], env: Mapping[str, str]) -> int | None:
    """The port the process of `argv` serves its endpoint on: `--metrics-address`, else
    CORRAL_METRICS_ADDR, else the default; None when it serves none (not a service, or `off`)."""
    if not serves(argv):
        return None
    address = env.get(METRICS_ADDR_ENV, DEFAULT_ADDRESS)
    for i, arg in enumerate(argv):
        if arg == "--metrics-address" and i + 1 < len(argv):
            address = argv[i + 1]
        elif arg.startswith("--metrics-address="):
            address = arg.partition("=")[2]
    parsed = parse_address(address)
    return None if parsed is None else parsed[1]


def _url_problems(url: str, port: int | None, env: Mapping[str, str]) -> list[str]:
    """A `corral healthcheck --url` target against the port served in the same container."""
    try:
        full = urlsplit(endpoint_url(url, env.get(METRICS_ADDR_ENV)))
    except ValueError as exc:
        return [str(exc)]
    problems = []
    if full.hostname not in LOCAL:
        problems.append(f"--url {url}: asks {full.hostname}, not this container (127.0.0.1)")
    if port is None or full.port != port:
        problems.append(f"--url {url}: port {full.port}, but the process serves "
                        f"{'nothing' if port is None else port}")
    if full.path not in PATHS:
        problems.append(f"--url {url}: path {full.path} is served by nothing (paths: {', '.join(PATHS)})")
    return problems


def healthcheck_url(argv: Sequence[str]) -> str | None:
    if len(argv) < 2 or Path(argv[0]).name != "corral" or argv[1] != "healthcheck":
        return None
    for i, arg in enumerate(argv):
        if arg == "--url" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--url="):
            return arg.partition("=")[2]
    return None


def _expand(argv: Sequence[str]) -> list[str]:
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", "VALUE", str(a)) for a in argv]


def container_env(container: Mapping[str, Any], config_maps: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """What the container's process sees: its ConfigMaps (`envFrom`) under its own `env` values."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        env.update(config_maps.get(((source.get("configMapRef") or {}).get("name")) or "", {}))
    env.update({e["name"]: str(e["value"]) for e in container.get("env") or [] if "value" in e})
    return env


def container_problems(container: Mapping[str, Any], env: Mapping[str, str],
                       annotations: Mapping[str, str]) -> list[str]:
    argv = _expand([*(container.get("command") or []), *(container.get("args") or [])])
    port = served_port(argv, env)
    named = {p.get("name"): p.get("containerPort") for p in container.get("ports") or [] if p.get("name")}
    problems: list[str] = []
    for declared in container.get("ports") or []:
        if port is not None and declared.get("containerPort") != port:
            problems.append(f"ports: {declared.get('containerPort')} is served by nothing (the process serves {port})")
    for probe in PROBES:
        spec = container.get(probe) or {}
        for kind in ("httpGet", "tcpSocket"):
            if kind not in spec:
                continue
            target = spec[kind].get("port")
            resolved = named.get(target) if isinstance(target, str) else target
            if isinstance(target, str) and resolved is None:
                problems.append(f"{probe}: port {target!r} is no named port of the container")
            elif resolved != port:
                problems.append(f"{probe}: port {target} ({resolved}) is served by nothing (the process serves "
                                f"{'nothing' if port is None else port})")
            path = str(spec[kind].get("path", "/healthz")).split("?")[0]
            if kind == "httpGet" and path not in PATHS:
                problems.append(f"{probe}: path {path} is served by nothing (paths: {', '.join(PATHS)})")
        url = healthcheck_url((spec.get("exec") or {}).get("command") or [])
        if url is not None:
            problems += [f"{probe}: {p}" for p in _url_problems(url, port, env)]
    if port is not None and annotations.get("prometheus.io/scrape") == "true":
        if annotations.get("prometheus.io/port") != str(port):
            problems.append(f"annotation prometheus.io/port {annotations.get('prometheus.io/port')!r}: the "
                            f"process serves {port}")
        if annotations.get("prometheus.io/path", "/metrics") != "/metrics":
            problems.append(f"annotation prometheus.io/path {annotations['prometheus.io/path']!r}: /metrics is served")
    return problems


def compose_argv(value: Any) -> list[str]:
    return shlex.split(value) if isinstance(value, str) else [str(a) for a in value or []]


def compose_service_problems(service: Mapping[str, Any], env: Mapping[str, str], health: Sequence[str]) -> list[str]:
    port = served_port(compose_argv(service.get("command")), env)
    problems: list[str] = []
    url = healthcheck_url(health)
    if url is not None:
        problems += [f"healthcheck: {p}" for p in _url_problems(url, port, env)]
    for published in service.get("ports") or []:
        inside = int(str(published).split("/")[0].rsplit(":", 1)[-1])
        if inside != port:
            problems.append(f"ports: {published} publishes {inside}, served by nothing (the process serves "
                            f"{'nothing' if port is None else port})")
    return problems


def prometheus_compose_problems(prometheus: Mapping[str, Any], services: Mapping[str, Any],
                                env_of: Any, job: str = "corral") -> list[str]:
    """The compose job's static targets are the compose services that serve, at their ports."""
    configs = [c for c in prometheus.get("scrape_configs") or [] if c.get("job_name") == job]
    if not configs:
        return [f"prometheus.yml: no job {job!r} for docker-compose"]
    targets = {t for sc in configs[0].get("static_configs") or [] for t in sc.get("targets") or []}
    wanted = set()
    for name, service in services.items():
        port = served_port(compose_argv(service.get("command")), env_of(service))
        if port is not None:
            wanted.add(f"{name}:{port}")
    problems = [f"prometheus.yml job {job}: target {t} is served by no compose service (they serve "
                f"{', '.join(sorted(wanted))})" for t in sorted(targets - wanted)]
    problems += [f"prometheus.yml job {job}: compose service {t} is not scraped" for t in sorted(wanted - targets)]
    return problems


def systemd_port_problems(directory: Path, instances: Sequence[str]) -> list[str]:
    """Every unit (and instance drop-in) that may share a host has its own CORRAL_METRICS_ADDR port."""
    ports: dict[str, int | None] = {}

    def port_in(text: str) -> int | None:
        found = re.findall(rf"(?m)^Environment=\"?{METRICS_ADDR_ENV}=([^\s\"]+)", text)
        parsed = parse_address(found[-1]) if found else parse_address(DEFAULT_ADDRESS)
        return None if parsed is None else parsed[1]

    problems: list[str] = []
    for unit in sorted(directory.glob("*.service")):
        if not unit.name.endswith("@.service"):
            if re.search(r"(?m)^ExecStart=\S*corral (agent|service)", unit.read_text()):
                ports[unit.name] = port_in(unit.read_text())
            continue
        for instance in instances:
            dropins = sorted((directory / f"{unit.name.removesuffix('@.service')}@{instance}.service.d").glob("*.conf"))
            text = unit.read_text() + "\n".join(d.read_text() for d in dropins)
            ports[f"{unit.name.removesuffix('.service')}{instance}"] = port_in(text)
    for dropin in sorted(directory.glob("*@*.service.d")):
        instance = dropin.name.split("@", 1)[1].removesuffix(".service.d")
        if instance not in instances:
            problems.append(f"{dropin.name}: {instance} is no instance (services: {', '.join(instances)})")
    seen: dict[int, str] = {}
    for name, port in ports.items():
        if port is not None and port in seen:
            problems.append(f"{name}: port {port} is also {seen[port]}'s: on one host the second one runs without "
                            "/metrics, /healthz and /readyz (give it a drop-in with its own CORRAL_METRICS_ADDR)")
        elif port is not None:
            seen[port] = name
    return problems
