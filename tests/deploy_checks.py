"""Static checks of the deploy files, with no Docker and no Kubernetes (issue 15, item 5).

The problem: docker-compose.yml ran the agent with `--cluster 4x8:H100`, which argparse took as an
abbreviation of `--cluster-file`; the agent exited 2 and restarted forever, and nothing noticed,
because no check ever read the deploy files. Each function here returns the problems of one kind
of file (empty: fine), each naming the file, the place and what is wrong, so a test can show both
that the real files pass and that a broken copy fails:

- `compose_problems`: every `corral ...` command (and healthcheck) of a Corral container is a
  command of the CLI with options it has; every `python -m` module exists; every variable set on a
  Corral container is read by the package source (on the NATS servers: used by their config; on
  Postgres: one its image reads); every file mounted from the repository exists.
- `kubernetes_problems`: every manifest of the kustomization validates against the Kubernetes
  schemas (`kubernetes-validate`, strict: an unknown field is an error), its `corral` commands and
  probes exist, its variables are read by the code.
- `nats_config_problems`: `nats-server -t` accepts the file, with every `$VARIABLE` it (or a file
  it includes) uses set to a dummy.
- `tilt_problems`: the Tiltfile's image and resources are the manifests' ones.
- `systemd_problems`: every unit's `corral` ExecStart is a command of the CLI with its options.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import typer
import yaml

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("libs", "services", "contracts")
#: Variables the official images read (docker-library postgres; the NVIDIA container runtime).
IMAGE_VARIABLES = {"postgres": {"POSTGRES_PASSWORD", "POSTGRES_DB", "POSTGRES_USER", "POSTGRES_HOST_AUTH_METHOD",
                                "POSTGRES_INITDB_ARGS", "PGDATA"}}
RUNTIME_VARIABLES = {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "PYTHONUNBUFFERED"}
KUBERNETES_VERSION = "1.30"


# ---- the CLI ---------------------------------------------------------------------------------

@cache
def _cli() -> Any:
    """The CLI as a click command tree (typer ships its own click: duck-typed below)."""
    from corral.cli.main import app

    return typer.main.get_command(app)


def cli_problems(argv: Sequence[str]) -> list[str]:
    """Problems of running `argv` (starting with `corral`): an unknown command or option."""
    if not argv or Path(argv[0]).name != "corral":
        return [f"{shlex.join(argv)}: not a `corral` command"]
    command, path, problems = _cli(), ["corral"], []
    args = list(argv[1:])
    while args:
        token = args.pop(0)
        if token.startswith("-"):
            name = token.split("=", 1)[0]
            param = next((p for p in command.params if name in (*p.opts, *p.secondary_opts)), None)
            if param is None:
                problems.append(f"{' '.join(path)}: no option {name} (see `{' '.join(path)} --help`)")
                continue
            takes_value = param.param_type_name == "option" and not param.is_flag and not param.count
            if takes_value and "=" not in token and args:
                args.pop(0)  # its value
            continue
        if hasattr(command, "commands"):
            sub = command.commands.get(token)
            if sub is None:
                known = ", ".join(sorted(command.commands))
                problems.append(f"{' '.join(path)}: no command {token!r} (commands: {known})")
                return problems
            command, path = sub, [*path, token]
        # else: an argument of a command
    if hasattr(command, "commands"):
        problems.append(f"{' '.join(path)}: a group, not a command")
    return problems


def command_problems(argv: Sequence[str]) -> list[str]:
    """`corral ...` against the CLI; `python -m MODULE` against the package."""
    if not argv:
        return []
    if Path(argv[0]).name == "corral":
        return cli_problems(argv)
    if Path(argv[0]).name.startswith("python") and len(argv) > 2 and argv[1] == "-m":
        import importlib.util

        try:
            found = importlib.util.find_spec(argv[2]) is not None
        except ModuleNotFoundError:
            found = False
        return [] if found else [f"{shlex.join(argv)}: no module {argv[2]}"]
    return []


# ---- variables -------------------------------------------------------------------------------

@cache
def _source_text() -> str:
    return "\n".join(p.read_text(errors="replace") for d in SOURCE_DIRS for p in (ROOT / d).rglob("*.py"))


@cache
def read_by_code(name: str) -> bool:
    """Whether the package source names the variable (as a string: `"CORRAL_X"` or an f-string part)."""
    return re.search(rf"\b{re.escape(name)}\b", _source_text()) is not None


def _env(environment: Any) -> dict[str, str]:
    if isinstance(environment, Mapping):
        return {str(k): "" if v is None else str(v) for k, v in environment.items()}
    if isinstance(environment, list):
        return {item.split("=", 1)[0]: item.partition("=")[2] for item in environment}
    return {}


def config_variables(path: Path) -> set[str]:
    """The `$VARIABLE`s a NATS config uses, its includes' too."""
    text = path.read_text()
    names = set(re.findall(r"\$([A-Za-z_][A-Za-z0-9_]*)", text))
    for include in re.findall(r"(?m)^\s*include\s+[\"']?([^\s\"']+)", text):
        target = path.parent / include
        if target.is_file():
            names |= config_variables(target)
    return names


# ---- docker-compose ----------------------------------------------------------------------------

def _is_corral(service: Mapping[str, Any]) -> bool:
    return "build" in service or str(service.get("image", "")).split(":")[0].endswith("corral")


def _healthcheck_argv(service: Mapping[str, Any]) -> list[str]:
    test = (service.get("healthcheck") or {}).get("test")
    if isinstance(test, list) and test and test[0] in ("CMD", "CMD-SHELL"):
        return list(test[1:]) if test[0] == "CMD" else shlex.split(test[1])
    return shlex.split(test) if isinstance(test, str) else []


def compose_problems(path: Path) -> list[str]:
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        return [f"{path.name}: not YAML: {exc}"]
    problems: list[str] = []
    services = doc.get("services") or {}
    if not services:
        return [f"{path.name}: no services"]
    for name, service in services.items():
        where = f"{path.name}: services.{name}"
        env = _env(service.get("environment"))
        mounts = [str(v).split(":")[0] for v in service.get("volumes") or [] if isinstance(v, str)]
        for mount in mounts:
            if mount.startswith(".") and not (path.parent / mount).exists():
                problems.append(f"{where}.volumes: {mount} does not exist")
        command = service.get("command")
        argv = shlex.split(command) if isinstance(command, str) else list(command or [])
        if _is_corral(service):
            problems += [f"{where}.command: {p}" for p in command_problems(argv)]
            health = _healthcheck_argv(service)
            problems += [f"{where}.healthcheck: {p}" for p in command_problems(health)]
            for var in env:
                if not read_by_code(var) and var not in RUNTIME_VARIABLES:
                    problems.append(f"{where}.environment: {var} is read by no Corral code (a typo, or a "
                                    "setting that does not exist)")
            continue
        image = str(service.get("image", "")).split(":")[0].split("/")[-1]
        if image == "nats":
            used = set()
            for mount in mounts:
                host = path.parent / mount
                for conf in ([host] if host.is_file() else sorted(host.glob("*.conf")) if host.is_dir() else []):
                    used |= config_variables(conf)
            for var in env:
                if var not in used:
                    problems.append(f"{where}.environment: {var} is used by no mounted NATS config")
        elif image in IMAGE_VARIABLES:
            for var in env:
                if var not in IMAGE_VARIABLES[image]:
                    problems.append(f"{where}.environment: {var} is not a variable the {image} image reads")
    return problems


# ---- Kubernetes --------------------------------------------------------------------------------

def kustomization_resources(kustomization: Path) -> list[Path]:
    doc = yaml.safe_load(kustomization.read_text())
    return [kustomization.parent / r for r in doc.get("resources") or []]


def _documents(path: Path) -> Iterator[dict[str, Any]]:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc:
            yield doc


def _containers(doc: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    spec = (doc.get("spec") or {}).get("template", {}).get("spec", {})
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def _expand(argv: Iterable[str]) -> list[str]:
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", "VALUE", a) for a in argv]


def kubernetes_problems(kustomization: Path, version: str = KUBERNETES_VERSION) -> list[str]:
    import kubernetes_validate

    problems: list[str] = []
    for path in kustomization_resources(kustomization):
        if not path.is_file():
            problems.append(f"{kustomization.name}: resource {path.name} does not exist")
            continue
        for doc in _documents(path):
            where = f"{path.name}: {doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                problems.append(f"{where}: {'.'.join(str(p) for p in exc.path)}: {exc.message}")
            except kubernetes_validate.utils.SchemaNotFoundError as exc:
                problems.append(f"{where}: no schema: {exc}")
            if doc.get("kind") == "ConfigMap":
                for var in (doc.get("data") or {}):
                    if not read_by_code(var):
                        problems.append(f"{where}.data: {var} is read by no Corral code")
            for container in _containers(doc):
                cwhere = f"{where} container {container.get('name')}"
                problems += [f"{cwhere}: {p}" for p in command_problems(_expand(container.get("command") or []))]
                for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                    argv = ((container.get(probe) or {}).get("exec") or {}).get("command") or []
                    problems += [f"{cwhere} {probe}: {p}" for p in command_problems(argv)]
                text = yaml.safe_dump(container)
                for var in (e.get("name", "") for e in container.get("env") or []):
                    if not (read_by_code(var) or var in RUNTIME_VARIABLES or f"$({var})" in text):
                        problems.append(f"{cwhere}: env {var} is read by no Corral code and used by no other value")
    return problems


def workloads(kustomization: Path) -> dict[str, set[str]]:
    """Name of each Deployment/DaemonSet/StatefulSet of the kustomization -> its container images."""
    found: dict[str, set[str]] = {}
    for path in kustomization_resources(kustomization):
        for doc in _documents(path):
            if doc.get("kind") in ("Deployment", "DaemonSet", "StatefulSet"):
                found[doc["metadata"]["name"]] = {str(c.get("image")) for c in _containers(doc)}
    return found


# ---- NATS ------------------------------------------------------------------------------------

def nats_config_problems(path: Path, nats_server: str) -> list[str]:
    env = {**os.environ, **{name: "dummy" for name in config_variables(path)}}
    proc = subprocess.run([nats_server, "-t", "-c", str(path)], capture_output=True, text=True, env=env,
                          timeout=30, cwd=path.parent)
    if proc.returncode != 0:
        return [f"{path.name}: nats-server -t: {(proc.stderr or proc.stdout).strip()}"]
    return []


# ---- Tilt ------------------------------------------------------------------------------------

def tilt_problems(tiltfile: Path, kustomization: Path) -> list[str]:
    text = tiltfile.read_text()
    problems: list[str] = []
    names = workloads(kustomization)
    images = set().union(*names.values()) if names else set()
    for image in re.findall(r"docker_build\(\s*'([^']+)'", text):
        if image not in images:
            problems.append(f"Tiltfile: docker_build({image!r}) builds an image no manifest runs ({sorted(images)})")
    for kustomized in re.findall(r"kustomize\(\s*'([^']+)'", text):
        if not (tiltfile.parent / kustomized / "kustomization.yaml").is_file():
            problems.append(f"Tiltfile: kustomize({kustomized!r}): no kustomization.yaml there")
    listed = re.findall(r"for name in \[([^\]]*)\]:\s*\n\s*k8s_resource\(name", text)
    resources = re.findall(r"k8s_resource\(\s*'([^']+)'", text) + [
        n for group in listed for n in re.findall(r"'([^']+)'", group)]
    for resource in resources:
        if resource not in names:
            problems.append(f"Tiltfile: k8s_resource({resource!r}) is no workload of the manifests ({sorted(names)})")
    return problems


# ---- systemd ---------------------------------------------------------------------------------

def systemd_problems(directory: Path) -> list[str]:
    problems: list[str] = []
    for unit in sorted(directory.glob("*.service")):
        for line in unit.read_text().splitlines():
            if not line.startswith("ExecStart="):
                continue
            argv = shlex.split(line.removeprefix("ExecStart=").lstrip("-@+!"))
            argv = [re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}|%[A-Za-z]", "VALUE", a) for a in argv]
            if argv and Path(argv[0]).name == "corral":
                problems += [f"{unit.name}: {p}" for p in cli_problems(argv)]
    return problems
