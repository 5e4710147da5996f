"""Shared fixtures: real infrastructure for integration and end-to-end tests.

Why: the design forbids mocks for anything that crosses a service boundary. Each test gets its own
nats-server (they start in ~50 ms) and its own Postgres database on a session-wide embedded
Postgres, so tests never see each other's state. When `CORRAL_NATS_URL` / `CORRAL_POSTGRES_DSN` are
set, the external servers are used instead, and isolation comes from a unique subject namespace and
a fresh database per test. `CORRAL_TEST_DOCKER=1` starts Postgres and NATS with testcontainers; where
no Docker engine answers, that path is skipped cleanly.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from corral.bus.auth import nats_authorization, superuser
from corral.stack.servers import NatsServer, PostgresServer


@dataclass(frozen=True)
class Infra:
    """Where a test's infrastructure lives."""

    nats_url: str
    postgres_dsn: str
    namespace: str  # unique subject/stream prefix for this test


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def _docker() -> Iterator[dict[str, str]]:
    if os.environ.get("CORRAL_TEST_DOCKER") != "1":
        yield {}
        return
    if not _docker_answers():
        pytest.skip("CORRAL_TEST_DOCKER=1 but no Docker engine answers; testcontainers path skipped")
    from testcontainers.core.container import DockerContainer
    from testcontainers.postgres import PostgresContainer

    with PostgresContainer("postgres:16", driver=None) as pg, \
            DockerContainer("nats:2.11").with_command("-js").with_exposed_ports(4222) as nc:
        host = nc.get_container_host_ip()
        yield {"postgres": pg.get_connection_url(), "nats": f"nats://{host}:{nc.get_exposed_port(4222)}"}


@pytest.fixture(scope="session")
def postgres_server_dsn(tmp_path_factory: pytest.TempPathFactory, _docker: dict[str, str]) -> Iterator[str]:
    """DSN of a Postgres server for the whole session (embedded unless given)."""
    external = os.environ.get("CORRAL_POSTGRES_DSN") or _docker.get("postgres")
    if external:
        yield external
        return
    # Not under pytest's basetemp: pytest prunes old basetemps, which would delete the data
    # directory of a Postgres still serving a concurrent session.
    data = Path(tempfile.mkdtemp(prefix="corral-test-pg-"))
    server = PostgresServer(data).start()
    try:
        yield server.dsn
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)


def _with_database(dsn: str, database: str) -> str:
    base, _, _ = dsn.rpartition("/")
    return f"{base}/{database}"


@pytest.fixture
async def postgres_dsn(postgres_server_dsn: str) -> AsyncIterator[str]:
    """A fresh, empty database for one test."""
    name = f"t_{secrets.token_hex(6)}"
    admin = await asyncpg.connect(_with_database(postgres_server_dsn, "postgres"))
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    yield _with_database(postgres_server_dsn, name)
    admin = await asyncpg.connect(_with_database(postgres_server_dsn, "postgres"))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture
def nats_url(tmp_path: Path, _docker: dict[str, str]) -> Iterator[str]:
    """A NATS server with JetStream for one test: a fresh embedded one unless given."""
    external = os.environ.get("CORRAL_NATS_URL") or _docker.get("nats")
    if external:
        yield external
        return
    data = Path(tempfile.mkdtemp(prefix="corral-test-nats-"))
    # With auth, as `corral up` runs it: the URL carries a superuser (tests publish anywhere); an
    # anonymous client cannot connect (see corral.bus.auth).
    password = secrets.token_urlsafe(16)
    server = NatsServer(data, authorization=nats_authorization([superuser("corral-test", password)])).start()
    try:
        yield f"nats://corral-test:{password}@{server.host}:{server.port}"
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def namespace() -> str:
    """A unique subject and stream prefix, so tests sharing one external NATS never collide."""
    return f"t{secrets.token_hex(4)}"


@pytest.fixture
def infra(nats_url: str, postgres_dsn: str, namespace: str) -> Infra:
    return Infra(nats_url=nats_url, postgres_dsn=postgres_dsn, namespace=namespace)


@pytest.fixture(scope="session")
def fake_nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake `libnvidia-ml.so.1` (tests/fakenvml), compiled once per session with the machine's C
    compiler; skipped, with the reason, where there is none."""
    import subprocess

    from tests import fakenvml

    if fakenvml.compiler() is None:
        pytest.skip("no C compiler (cc, gcc or $CC) to build the fake NVML library")
    try:
        return fakenvml.build(tmp_path_factory.mktemp("fakenvml"))
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"the fake NVML library did not compile:\n{exc.stderr}")


@pytest.fixture
def fake_nvml(fake_nvml_lib: Path, tmp_path: Path) -> Iterator[object]:
    """A fake NVML of eight GPUs in two NVLink domains (0-3, 4-7), its file in this test's folder."""
    from tests import fakenvml

    fake = fakenvml.FakeNvml(fake_nvml_lib, tmp_path / "fake-nvml.conf")
    fake.write(fakenvml.eight_gpus_two_domains())
    yield fake
