"""`corral up --listen` / `--advertise-address` and the join command it prints (corral.stack.join)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from corral.stack import join


def test_listen_is_an_ip_address_and_a_host_name_is_told_where_it_goes() -> None:
    assert join.check_listen("127.0.0.2") == "127.0.0.2"
    with pytest.raises(ValueError, match="--advertise-address"):
        join.check_listen("gpu-head.example.org")


def test_clients_are_given_the_listen_address_or_for_a_wildcard_this_host_s_name() -> None:
    assert join.advertised("10.0.0.5") == "10.0.0.5"
    assert join.advertised("0.0.0.0") == socket.gethostname()
    assert join.advertised("0.0.0.0", "head.example.org") == "head.example.org"
    assert join.certificate_hosts("0.0.0.0", "head.example.org") == ("head.example.org",)
    assert join.certificate_hosts("10.0.0.5", "head.example.org") == ("head.example.org", "10.0.0.5")


def test_the_join_command_names_the_copied_files_where_it_expects_them(tmp_path: Path) -> None:
    cmd = join.join_command("gpu-01", "tls://10.0.0.5:4222", "corral", tmp_path / "agent-node-agent-gpu-01.json",
                            tmp_path / "ca.pem")
    assert cmd.copy == ((str(tmp_path / "ca.pem"), "/etc/corral/ca.pem"),
                        (str(tmp_path / "agent-node-agent-gpu-01.json"), "/etc/corral/agent-node-agent-gpu-01.json"))
    assert cmd.shell() == ("CORRAL_NATS_URL=tls://10.0.0.5:4222 CORRAL_NATS_CA=/etc/corral/ca.pem "
                           "CORRAL_NATS_CREDENTIALS=/etc/corral/agent-node-agent-gpu-01.json "
                           "corral agent --node gpu-01")
    other = join.join_command("gpu-01", "nats://h:4222", "team", None, None)
    assert other.env == {"CORRAL_NATS_URL": "nats://h:4222", "CORRAL_NAMESPACE": "team"} and other.copy == ()
