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
  it includes) uses set to a dummy, and the certificates it reads from the mounted TLS directory
  (`/etc/nats-tls/`) made for the check by `corral.stack.tls`.
- `tilt_problems`: the Tiltfile runs (Starlark, with Tilt's functions stubbed with their real
  parameters) and what it names exists: the manifests' image and workloads, the Dockerfile, the
  live-update folders at the image's install path, the kustomization, the chart's values file and
  version.
- `systemd_problems`: every unit's `corral` ExecStart is a command of the CLI with its options,
  and the processes of one host each have their own metrics port.

Probes and scrape targets (Kubernetes, compose, systemd, prometheus.yml) must point at the port and
path the process serves: tests/deploy_probes.py.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import typer
import yaml

from tests import deploy_probes as probes

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("libs", "services", "contracts")
#: Variables the official images read (docker-library postgres; the NVIDIA container runtime).
IMAGE_VARIABLES = {"postgres": {"POSTGRES_PASSWORD", "POSTGRES_DB", "POSTGRES_USER", "POSTGRES_HOST_AUTH_METHOD",
                                "POSTGRES_INITDB_ARGS", "PGDATA"}}
RUNTIME_VARIABLES = {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "PYTHONUNBUFFERED"}
KUBERNETES_VERSION = "1.30"
#: Mounted files that are made on the deploying machine, never committed (the keys): their sources
#: may be missing here. deploy/README.md: `python -m corral.stack.tls deploy/tls nats-1 nats-2 nats-3`.
GENERATED_MOUNTS = ("./deploy/tls/",)
#: Where the NATS configs read the route TLS files (mounted from deploy/tls by docker-compose).
NATS_TLS_DIR = "/etc/nats-tls/"


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
            if mount.startswith(".") and not (path.parent / mount).exists() and not mount.startswith(GENERATED_MOUNTS):
                problems.append(f"{where}.volumes: {mount} does not exist")
        command = service.get("command")
        argv = shlex.split(command) if isinstance(command, str) else list(command or [])
        if _is_corral(service):
            problems += [f"{where}.command: {p}" for p in command_problems(argv)]
            health = _healthcheck_argv(service)
            problems += [f"{where}.healthcheck: {p}" for p in command_problems(health)]
            problems += [f"{where}.{p}" for p in probes.compose_service_problems(service, env, health)]
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
    config_maps = {str(doc["metadata"]["name"]): {str(k): str(v) for k, v in (doc.get("data") or {}).items()}
                   for path in kustomization_resources(kustomization) if path.is_file()
                   for doc in _documents(path) if doc.get("kind") == "ConfigMap"}
    for path in kustomization_resources(kustomization):
        if not path.is_file():
            problems.append(f"{kustomization.name}: resource {path.name} does not exist")
            continue
        for doc in _documents(path):
            annotations = ((doc.get("spec") or {}).get("template", {}).get("metadata") or {}).get("annotations") or {}
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
                problems += [f"{cwhere} {p}" for p in probes.container_problems(
                    container, probes.container_env(container, config_maps), annotations)]
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
    with tempfile.TemporaryDirectory(prefix="corral-nats-check-") as tmp:
        if NATS_TLS_DIR in path.read_text():
            from corral.stack import tls

            certs = tls.generate(Path(tmp) / "tls", ["nats-1", "nats-2", "nats-3"])
            copy = Path(tmp) / "conf"
            shutil.copytree(path.parent, copy)
            path = copy / path.name
            path.write_text(path.read_text().replace(NATS_TLS_DIR, f"{certs.directory}/"))
        proc = subprocess.run([nats_server, "-t", "-c", str(path)], capture_output=True, text=True, env=env,
                              timeout=30, cwd=path.parent)
    if proc.returncode != 0:
        return [f"{path.name}: nats-server -t: {(proc.stderr or proc.stdout).strip()}"]
    return []


# ---- Tilt ----------------------------------------------------------------------------------

#: The image's site-packages (deploy/Dockerfile: `FROM python:X.Y-slim`, then `pip install`).
SITE_PACKAGES = "/usr/local/lib/python{version}/site-packages/"


def _tilt_api(calls: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Tilt's functions the Tiltfile may call (https://docs.tilt.dev/api.html and the helm_resource
    extension), with their parameter names: another function or parameter fails as in Tilt. Each
    records its call; `kustomize` and `sync` return what they were given."""

    def docker_build(ref: str, context: str, build_args: Any = None, dockerfile: str = "Dockerfile",
                     dockerfile_contents: Any = None, live_update: Any = (), match_in_env_vars: bool = False,
                     ignore: Any = (), only: Any = (), entrypoint: Any = (), target: str = "", ssh: Any = "",
                     network: str = "", secret: Any = "", extra_tag: Any = "", container_args: Any = None,
                     cache_from: Any = (), pull: bool = False, platform: str = "", extra_hosts: Any = ()) -> None:
        calls.append(("docker_build", {"ref": ref, "context": context, "dockerfile": dockerfile,
                                       "live_update": list(live_update)}))

    def sync(local_path: str, remote_path: str) -> dict[str, str]:
        return {"sync": local_path, "to": remote_path}

    def kustomize(pathToDir: str, kustomize_bin: Any = None, flags: Any = ()) -> dict[str, str]:
        calls.append(("kustomize", {"path": pathToDir}))
        return {"kustomize": pathToDir}

    def k8s_yaml(yaml: Any, allow_duplicates: bool = False) -> None:
        calls.append(("k8s_yaml", {"yaml": yaml}))

    def k8s_resource(workload: str = "", new_name: str = "", port_forwards: Any = (), extra_pod_selectors: Any = (),
                     trigger_mode: Any = None, resource_deps: Any = (), objects: Any = (), auto_init: bool = True,
                     pod_readiness: str = "", links: Any = (), labels: Any = (), discovery_strategy: str = "") -> None:
        calls.append(("k8s_resource", {"workload": workload, "resource_deps": list(resource_deps)}))

    def helm_repo(name: str, url: str, resource_name: str = "", labels: Any = ()) -> None:
        calls.append(("helm_repo", {"name": name, "url": url}))

    def helm_resource(name: str, chart: str, deps: Any = (), image_deps: Any = (), image_keys: Any = (),
                      flags: Any = (), image_selector: str = "", labels: Any = (), resource_deps: Any = (),
                      namespace: str = "", release_name: str = "", pod_readiness: str = "ready",
                      update_dependencies: bool = False) -> None:
        calls.append(("helm_resource", {"name": name, "chart": chart, "flags": list(flags),
                                        "resource_deps": list(resource_deps)}))

    return {f.__name__: f for f in (docker_build, sync, kustomize, k8s_yaml, k8s_resource, helm_repo, helm_resource)}


TILT_EXTENSIONS = {"ext://helm_resource": ("helm_resource", "helm_repo")}


def tilt_calls(tiltfile: Path) -> list[tuple[str, dict[str, Any]]]:
    """Run the Tiltfile (Starlark, as Tilt's dialect: top-level statements) against `_tilt_api`;
    the calls it made. A StarlarkError when it does not run."""
    import starlark as sl

    calls: list[tuple[str, dict[str, Any]]] = []
    api = _tilt_api(calls)
    module = sl.Module()
    for name, fn in api.items():
        if not any(name in names for names in TILT_EXTENSIONS.values()):
            module.add_callable(name, fn)

    def load(path: str) -> Any:
        if path not in TILT_EXTENSIONS:
            raise ValueError(f"load({path!r}): not an extension this check knows ({sorted(TILT_EXTENSIONS)})")
        ext = sl.Module()
        for name in TILT_EXTENSIONS[path]:
            ext.add_callable(name, api[name])
        return ext.freeze()

    dialect = sl.Dialect.extended()
    dialect.enable_top_level_stmt = True
    ast = sl.parse(tiltfile.name, tiltfile.read_text(), dialect)
    sl.eval(module, ast, sl.Globals.standard(), sl.FileLoader(load))
    return calls


def _package_roots(setup_py: Path) -> dict[str, str]:
    """setup.py's ROOTS (package -> folder) as folder -> path inside site-packages."""
    import ast

    tree = ast.parse(setup_py.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "ROOTS" for t in node.targets):
            roots: dict[str, str] = ast.literal_eval(node.value)
            return {folder: package.replace(".", "/") for package, folder in roots.items()}
    raise ValueError(f"{setup_py}: no ROOTS")


def _docker_build_problems(call: Mapping[str, Any], root: Path, images: set[str]) -> list[str]:
    problems = []
    if call["ref"] not in images:
        problems.append(f"Tiltfile: docker_build({call['ref']!r}) builds an image no manifest runs ({sorted(images)})")
    dockerfile = root / call["context"] / call["dockerfile"]
    if not dockerfile.is_file():
        return [*problems, f"Tiltfile: docker_build: no Dockerfile {call['dockerfile']}"]
    found = re.search(r"(?m)^FROM python:(\d+\.\d+)", dockerfile.read_text())
    site = SITE_PACKAGES.format(version=found.group(1) if found else "?")
    roots = _package_roots(root / "setup.py")
    for step in call["live_update"]:
        local, remote = str(step.get("sync", "")).removeprefix("./").rstrip("/"), step.get("to")
        if not (root / local).is_dir():
            problems.append(f"Tiltfile: sync({step.get('sync')!r}): no such folder")
        elif local not in roots or remote != site + roots[local]:
            want = site + roots[local] if local in roots else f"one of {sorted(roots)}"
            problems.append(f"Tiltfile: sync({step.get('sync')!r}, {remote!r}): the image has it at {want}")
    return problems


def tilt_problems(tiltfile: Path, kustomization: Path, chart_version: str | None = None) -> list[str]:
    """Run the Tiltfile with Tilt's API stubbed (`tilt_calls`) and check what each call names: the
    image the manifests run, its Dockerfile and live-update folders (where the image installs them),
    the kustomization, the workloads and resources named, the chart's values file and version."""
    try:
        calls = tilt_calls(tiltfile)
    except Exception as exc:  # starlark.StarlarkError: a name, a parameter, a syntax error
        return [f"Tiltfile does not run: {str(exc).strip().splitlines()[0]}"]
    root = tiltfile.parent
    names = workloads(kustomization)
    images = set().union(*names.values()) if names else set()
    repos = {c["name"] for kind, c in calls if kind == "helm_repo"}
    charts = {c["name"] for kind, c in calls if kind == "helm_resource"}
    problems: list[str] = []
    for kind, call in calls:
        if kind == "docker_build":
            problems += _docker_build_problems(call, root, images)
        elif kind == "kustomize" and not (root / call["path"] / "kustomization.yaml").is_file():
            problems.append(f"Tiltfile: kustomize({call['path']!r}): no kustomization.yaml there")
        elif kind == "k8s_resource":
            if call["workload"] not in names:
                problems.append(f"Tiltfile: k8s_resource({call['workload']!r}) is no workload of the manifests "
                                f"({sorted(names)})")
            problems += [f"Tiltfile: k8s_resource({call['workload']!r}): resource_deps {d!r} is no resource"
                         for d in call["resource_deps"] if d not in names and d not in charts]
        elif kind == "helm_resource":
            repo = call["chart"].split("/")[0]
            if repo not in repos:
                problems.append(f"Tiltfile: helm_resource chart {call['chart']!r}: no helm_repo {repo!r}")
            flags = call["flags"]
            values = [flags[i + 1] for i, f in enumerate(flags[:-1]) if f in ("--values", "-f")]
            problems += [f"Tiltfile: helm_resource {call['name']!r}: no values file {v}" for v in values
                         if not (root / v).is_file()]
            version = next((flags[i + 1] for i, f in enumerate(flags[:-1]) if f == "--version"), None)
            if chart_version is not None and version != chart_version:
                problems.append(f"Tiltfile: helm_resource {call['name']!r}: --version {version} is not the chart "
                                f"version the values are checked against ({chart_version})")
    if not any(kind == "k8s_yaml" for kind, _ in calls):
        problems.append("Tiltfile: no k8s_yaml: it deploys nothing")
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
    from corral.cli.service import ServiceName

    return problems + probes.systemd_port_problems(directory, [s.value for s in ServiceName])
