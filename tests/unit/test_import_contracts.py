"""The import contracts cover what they claim, and the worker protocol stays cheap to import.

import-linter checks the contracts in pyproject.toml (CI; `make lint` on the working tree); these
tests check what it cannot: that a new service is listed in the independence contract, and that
importing `corral.worker` (inside every job) loads no third-party package at run time.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def contract(name_start: str) -> dict[str, Any]:
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    found = [c for c in contracts if c["name"].startswith(name_start)]
    assert len(found) == 1, f"one import-linter contract named {name_start!r}..."
    return found[0]


def test_every_service_is_in_the_service_independence_contract() -> None:
    services = {f"corral.services.{p.parent.name}" for p in (REPO / "services").glob("*/service.py")}
    assert services, "services/<name>/service.py: the layout this test reads"
    assert set(contract("No service imports another service")["modules"]) == services


def test_the_simulator_sits_below_the_services_and_the_cli() -> None:
    """Quota's evidence gate replays the log with the simulator; the simulator never reaches a service."""
    layers: list[str] = contract("Layers:")["layers"]
    rank = {m.strip(): i for i, layer in enumerate(layers) for m in layer.split("|")}
    assert rank["corral.cli"] < rank["corral.services"] < rank["corral.sim"] < rank["corral.projection"]
    assert rank["corral.projection"] < rank["corral.core"]


def test_importing_the_worker_helper_loads_only_the_standard_library() -> None:
    code = ("import sys, corral.worker; "
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('msgspec', 'yaml', 'pydantic', 'nats', 'asyncpg') or m.startswith('corral.contracts.'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert loaded == ["corral.contracts.worker"]


def test_the_contracts_package_still_reexports_every_name_lazily() -> None:
    import corral.contracts as contracts
    from corral.contracts import JobSpec, JobSubmitted, validate_job_spec
    from corral.contracts import events as ev
    from corral.contracts.jobspec import JobSpec as JobSpecHome

    assert JobSpec is JobSpecHome and JobSubmitted is ev.JobSubmitted
    assert callable(validate_job_spec)
    assert {"JobSpec", "Reason", "decode", *ev.__all__} <= set(contracts.__all__)
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        _ = contracts.NoSuchThing


def test_the_worker_protocol_is_defined_once() -> None:
    import corral.worker
    from corral.contracts import lifecycle, worker

    assert corral.worker.CHECKPOINTED_EXIT_CODE == worker.WorkerExit.CHECKPOINTED == 85
    assert lifecycle.WorkerExit is worker.WorkerExit
    assert corral.worker.ENV_RESUME_FROM is worker.ENV_RESUME_FROM == "CORRAL_RESUME_FROM"
    assert corral.worker.signal_from_name is worker.signal_from_name
