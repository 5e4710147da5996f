"""A service with CORRAL_HEALTH_FILE touches it while it runs and reaches NATS, and
`corral healthcheck` says so (the probe of docker-compose and the Kubernetes manifests)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from corral.services.admission.service import Admission
from corral.services.run_loop import run_service
from corral.services.settings import Settings
from tests.conftest import Infra


def healthcheck(path: Path) -> int:
    return subprocess.run([sys.executable, "-m", "corral.cli.main", "healthcheck", "--file", str(path),
                           "--max-age", "30"], capture_output=True, timeout=60).returncode


async def test_a_running_service_is_healthy_and_a_stopped_one_is_not(
        infra: Infra, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    health = tmp_path / "admission.health"
    monkeypatch.setenv("CORRAL_HEALTH_FILE", str(health))
    assert healthcheck(health) == 1  # nothing yet
    stop = asyncio.Event()
    task = asyncio.create_task(run_service(Admission, Settings(infra.nats_url, infra.postgres_dsn, infra.namespace),
                                           stop=stop))
    try:
        for _ in range(100):
            if health.exists():
                break
            await asyncio.sleep(0.1)
        assert health.exists(), "the service never touched its health file"
        assert await asyncio.to_thread(healthcheck, health) == 0
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
