"""`corral credentials postgres`: a deployment's services get their own Postgres logins, as with
`corral up`, so that no process of docker-compose or Kubernetes logs in as the owner; and its
people (`corral credentials person`) NATS identities and Postgres logins of their own.

Against a fresh database of the session's server: each service's login is in `corral_service`
(it appends, it cannot rewrite), the CLI's in `corral_reader`; the Kubernetes Secrets validate and
are the ones the manifests read; a second run keeps the passwords.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import asyncpg
import kubernetes_validate
import nats
import pytest
import yaml
from typer.testing import CliRunner

from corral.cli.main import app
from corral.stack.servers import NatsReloadError, NatsServer
from tests import deploy_checks as checks

K8S = checks.ROOT / "deploy" / "kubernetes"
SERVICES = ("admission", "quota", "placement", "preemption")


def _run(*args: str) -> str:
    result = CliRunner().invoke(app, ["credentials", "postgres", *args])
    assert result.exit_code == 0, result.output
    return result.output


async def _groups(dsn: str, **kw: Any) -> set[str]:
    conn = await asyncpg.connect(dsn, **kw)
    try:
        rows = await conn.fetch("SELECT g.rolname FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid "
                                "JOIN pg_roles u ON u.oid = m.member WHERE u.rolname = current_user")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("UPDATE events SET stream = stream")
        return {r["rolname"] for r in rows}
    finally:
        await conn.close()


async def test_each_service_gets_its_own_login_and_the_secrets_are_the_manifests(postgres_dsn: str,
                                                                                tmp_path: Path) -> None:
    owner = postgres_dsn
    store = tmp_path / "ids"
    listed = json.loads(_run("--owner-dsn", owner, "--dir", str(store), "--json"))["logins"]
    by = {r["component"]: r for r in listed}
    assert set(by) == {*SERVICES, "cli"}
    for name in SERVICES:
        assert await _groups(by[name]["dsn"]) == {"corral_service"}, name
    assert await _groups(by["cli"]["dsn"]) == {"corral_reader"}
    assert all("passfile=" in r["dsn"] and ":" not in r["dsn"].split("@")[0].split("//")[1] for r in listed)

    secrets = {d["metadata"]["name"]: d for d in yaml.safe_load_all(
        _run("--owner-dsn", owner, "--dir", str(store), "--format", "k8s-secret")) if d}
    assert set(secrets) == {f"corral-postgres-{n}" for n in (*SERVICES, "cli")}
    for doc in secrets.values():
        kubernetes_validate.validate(doc, checks.KUBERNETES_VERSION, strict=True)
    assert await _groups(secrets["corral-postgres-quota"]["stringData"]["dsn"]) == {"corral_service"}
    # again: the same passwords (the Secrets can be applied again)
    again = json.loads(_run("--owner-dsn", owner, "--dir", str(store), "--json"))["logins"]
    assert again == listed
    assert await _groups(secrets["corral-postgres-admission"]["stringData"]["dsn"]) == {"corral_service"}

    # What each manifest reads is its own Secret.
    for name in SERVICES:
        doc = yaml.safe_load((K8S / f"{name}.yaml").read_text())
        env = {e["name"]: e for e in doc["spec"]["template"]["spec"]["containers"][0]["env"]}
        ref = env["CORRAL_POSTGRES_DSN"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": f"corral-postgres-{name}", "key": "dsn"}, name


def test_the_compose_services_connect_with_their_own_logins() -> None:
    services = yaml.safe_load((checks.ROOT / "docker-compose.yml").read_text())["services"]
    logins = services["postgres-logins"]
    assert logins["command"][:3] == ["corral", "credentials", "postgres"]
    for name in SERVICES:
        dsn = services[name]["environment"]["CORRAL_POSTGRES_DSN"]
        assert dsn.startswith(f"postgresql://corral_svc_{name}@postgres:5432/corral?passfile="), (name, dsn)
        assert services[name]["depends_on"]["postgres-logins"] == {"condition": "service_completed_successfully"}
    dsns = [str(s.get("environment", {}).get("CORRAL_POSTGRES_DSN", "")) for s in services.values()]
    assert not any(d.startswith("postgresql://postgres:") for d in dsns), "no process logs in as the superuser"


def _person(*args: str) -> str:
    result = CliRunner().invoke(app, ["--namespace", "corral", "credentials", "person", *args])
    assert result.exit_code == 0, result.output
    return result.output


async def test_a_deployments_people_get_nats_identities_and_postgres_logins(postgres_dsn: str, tmp_path: Path) -> None:
    """`corral credentials person`: the deployment's auth.conf names each person; a nats-server that
    re-reads it (the chart's reloader sends the same SIGHUP) closes a removed person's connection and
    keeps the others; `corral credentials postgres` gives each person a login in corral_person and
    drops a removed one's."""
    store = tmp_path / "ids"
    _person("alice", "--dir", str(store))
    _person("nightly", "--pipeline", "--dir", str(store))
    auth_conf = _person("--dir", str(store), "--format", "nats-conf")
    assert 'user: "alice"' in auth_conf and 'user: "nightly"' in auth_conf and 'user: "admin"' in auth_conf
    creds = {n: json.loads((store / "credentials" / f"{n}.json").read_text()) for n in ("alice", "nightly")}
    assert creds["nightly"]["kind"] == "pipeline"

    logins = {r["component"]: r for r in json.loads(_run("--owner-dsn", postgres_dsn, "--dir", str(store),
                                                          "--json"))["logins"]}
    conn = await asyncpg.connect(logins["person alice"]["dsn"])
    try:
        assert await conn.fetchval("SELECT count(*) FROM events") == 0
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("INSERT INTO relay_positions VALUES ('x', 0)")
    finally:
        await conn.close()

    server = NatsServer(tmp_path / "nats", authorization_include="auth.conf")
    server.data_dir.mkdir(parents=True)
    (server.data_dir / "auth.conf").write_text(auth_conf)
    server.start()
    try:
        closed = asyncio.Event()

        async def on_closed() -> None:
            closed.set()

        options: dict[str, Any] = {"allow_reconnect": False, "max_reconnect_attempts": 0, "connect_timeout": 2}
        alice = await nats.connect(server.url, user="alice", password=creds["alice"]["password"],
                                   closed_cb=on_closed, **options)
        nightly = await nats.connect(server.url, user="nightly", password=creds["nightly"]["password"], **options)
        pid = server.proc.pid if server.proc else None
        (server.data_dir / "auth.conf").write_text(_person("--remove", "alice", "--dir", str(store),
                                                           "--format", "nats-conf"))
        assert server.reload()
        await asyncio.wait_for(closed.wait(), 10)
        await nightly.flush(timeout=5)  # the others keep their connections
        await nightly.close()
        await alice.close()
        assert server.proc is not None and server.proc.pid == pid
        with pytest.raises(nats.errors.Error):
            await nats.connect(server.url, user="alice", password=creds["alice"]["password"], **options)
        # a configuration the server cannot read is refused, and the old one stays
        (server.data_dir / "auth.conf").write_text("authorization { users = [ {user: ")
        with pytest.raises(NatsReloadError):
            server.reload()
    finally:
        server.stop()

    again = {r["component"] for r in json.loads(_run("--owner-dsn", postgres_dsn, "--dir", str(store),
                                                      "--json"))["logins"]}
    assert "person alice" not in again and "person nightly" in again
    with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError):
        await asyncpg.connect(logins["person alice"]["dsn"])
