"""`corral credentials agent NODE...`: per-node agent identities for a deployment, as Kubernetes
Secrets and the NATS servers' auth.conf, generated rather than written by hand.

The Secrets validate against the Kubernetes schemas (as deploy/kubernetes does) and are the ones
the manifests mount; the auth.conf, included by deploy/nats/nats.conf, passes `nats-server -t`; a
real nats-server with it admits each node's identity and refuses a revoked one. A second run keeps
the passwords (its output can be applied again).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate
import nats
import pytest
import yaml
from typer.testing import CliRunner

from corral.cli.main import app
from corral.stack.servers import NatsServer, nats_server_binary
from tests import deploy_checks as checks

K8S = checks.ROOT / "deploy" / "kubernetes"


def _run(*args: str) -> str:
    result = CliRunner().invoke(app, ["--namespace", "corral", "credentials", "agent", *args])
    assert result.exit_code == 0, result.output
    return result.output


def _secrets(text: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(text) if d}


async def test_node_identities_as_kubernetes_secrets_and_nats_users(tmp_path: Path) -> None:
    store = tmp_path / "ids"
    first = _secrets(_run("gpu-01", "gpu-02", "--dir", str(store), "--format", "k8s-secret"))
    assert set(first) == {"corral-nats-auth", "corral-nats-services", "corral-nats-agents"}
    for doc in first.values():
        kubernetes_validate.validate(doc, checks.KUBERNETES_VERSION, strict=True)
    agents = first["corral-nats-agents"]["stringData"]
    assert set(agents) == {"gpu-01.json", "gpu-02.json"}
    creds = {k.removesuffix(".json"): json.loads(v) for k, v in agents.items()}
    assert {n: (c["user"], c["role"]) for n, c in creds.items()} == {
        "gpu-01": ("agent-node-agent-gpu-01", "agent"), "gpu-02": ("agent-node-agent-gpu-02", "agent")}
    assert creds["gpu-01"]["password"] != creds["gpu-02"]["password"], "a password per node"

    # What the manifests mount is what this prints.
    daemonset = yaml.safe_load((K8S / "agent.yaml").read_text())
    spec = daemonset["spec"]["template"]["spec"]
    assert {"name": "nats-credentials", "secret": {"secretName": "corral-nats-agents", "defaultMode": 0o400}} \
        in spec["volumes"]
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["CORRAL_NATS_CREDENTIALS"] == "/etc/corral/nats/$(NODE_NAME).json"
    values = yaml.safe_load((K8S / "nats-values.yaml").read_text())
    assert values["config"]["merge"]["$include"] == "../nats-auth/auth.conf"
    assert {"name": "corral-nats-auth", "secret": {"secretName": "corral-nats-auth"}} \
        in values["podTemplate"]["merge"]["spec"]["volumes"]

    # Again, adding a node and revoking one: the others keep their passwords.
    again = _secrets(_run("gpu-03", "--revoke", "gpu-02", "--dir", str(store), "--format", "k8s-secret"))
    kept = again["corral-nats-agents"]["stringData"]
    assert set(kept) == {"gpu-01.json", "gpu-03.json"} and kept["gpu-01.json"] == agents["gpu-01.json"]
    assert again["corral-nats-services"] == first["corral-nats-services"]
    auth_conf = again["corral-nats-auth"]["stringData"]["auth.conf"]
    assert auth_conf == _run("--dir", str(store), "--format", "nats-conf")

    # deploy/nats/nats.conf with this auth.conf: nats-server -t accepts it ...
    shutil.copytree(checks.ROOT / "deploy" / "nats", tmp_path / "nats")
    (tmp_path / "nats" / "auth.conf").write_text(auth_conf)
    assert checks.nats_config_problems(tmp_path / "nats" / "nats.conf", nats_server_binary()) == []
    # ... and a nats-server admits each node's identity, not the revoked one's.
    server = NatsServer(tmp_path / "server", authorization=auth_conf).start()
    try:
        for node in ("gpu-01", "gpu-03"):
            c = json.loads(kept[f"{node}.json"])
            nc = await nats.connect(server.url, user=c["user"], password=c["password"], allow_reconnect=False)
            await nc.close()
        with pytest.raises(nats.errors.Error):
            c = creds["gpu-02"]
            await nats.connect(server.url, user=c["user"], password=c["password"], allow_reconnect=False,
                               max_reconnect_attempts=0, connect_timeout=2)
    finally:
        server.stop()


def test_a_node_name_that_cannot_be_an_identity_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["credentials", "agent", "gpu 01", "--dir", str(tmp_path)])
    assert result.exit_code == 2 and "gpu 01" in result.output and "Traceback" not in result.output, result.output
