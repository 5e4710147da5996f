"""`corral agent`: what it hosts, the address it advertises, and one clear line (exit 2) for every
flag or file that cannot work. Loopback addresses only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli.agent import AgentUsageError, address_towards, check_address, file_inventories, host_inventories
from corral.cli.main import app


def cluster_file(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps({"nodes": [{"name": n, "gpus": 2, "model": "CPU"} for n in ("a", "b", "c")]}))
    return path


def test_an_inventory_file_runs_its_nodes_or_those_named(tmp_path: Path) -> None:
    path = cluster_file(tmp_path)
    assert [n.node for n in file_inventories(path, [])] == ["a", "b", "c"]
    (b,) = file_inventories(path, ["b"])
    assert b.node == "b" and len(b.gpus) == 2 and b.gpus[0].model == "CPU"
    with pytest.raises(AgentUsageError, match=r"--node z: not in .*hosts.json \(its nodes: a, b, c\)"):
        file_inventories(path, ["z"])
    shorthand = tmp_path / "one"
    shorthand.write_text("1x4:H100\n")
    assert [len(n.gpus) for n in file_inventories(shorthand, [])] == [4]
    fake = tmp_path / "fake.yaml"
    fake.write_text("node: box\nmodel: L4\nmemory_gib: 24\ngpus: 2\nrack: r9\n")
    (box,) = file_inventories(fake, [])
    assert box.node == "box" and box.rack == "r9" and [g.memory_gib for g in box.gpus] == [24.0, 24.0]
    with pytest.raises(AgentUsageError, match="no such file"):
        file_inventories(tmp_path / "missing.yaml", [])
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [{name: a, gpus: -1}]\n")
    with pytest.raises(AgentUsageError, match="--inventory"):
        file_inventories(bad, [])


def test_without_a_gpu_the_default_says_to_declare_an_inventory(monkeypatch: pytest.MonkeyPatch) -> None:
    import corral.services.node_agent.__main__ as agent_main
    from corral.services.node_agent.host.inventory import NvmlUnavailable

    monkeypatch.setattr(agent_main, "discover", lambda *a, **k: NvmlUnavailable("no driver"))
    with pytest.raises(AgentUsageError, match="--inventory FILE"):
        host_inventories(None, [], "rack-0", "zone-0", None)
    with pytest.raises(AgentUsageError, match="at most one --node"):
        host_inventories("nvml", ["x", "y"], "rack-0", "zone-0", None)


def test_addresses() -> None:
    for good in ("127.0.0.2", "gpu-01.example.internal", "fe80::1"):
        assert check_address(good) == good
    for bad in ("127.0.0.2; rm -rf /", "two words", "", "-x"):
        with pytest.raises(AgentUsageError, match="--advertise-address"):
            check_address(bad)
    assert address_towards("nats://127.0.0.1:4222").startswith("127.")
    assert address_towards("tls://u:p@127.0.0.3:4222,nats://127.0.0.4:4222").startswith("127.")
    with pytest.raises(AgentUsageError, match="--advertise-address"):
        address_towards("nats://:4222")


@pytest.mark.parametrize(("args", "words"), [
    (["--inventory", "nope.yaml"], "no such file"),
    (["--inventory", "{hosts}", "--port-range", "30000-29000"], "--port-range"),
    (["--inventory", "{hosts}", "--port-range", "29000"], "LO-HI"),
    (["--inventory", "{hosts}", "--advertise-address", "a b"], "--advertise-address"),
    (["--inventory", "{hosts}", "--run-as", "nobody"], "--run-as"),
    (["--inventory", "{hosts}", "--runtime", "docker"], "--runtime"),
])
def test_a_flag_that_cannot_work_is_one_line_and_exit_2(tmp_path: Path, args: list[str], words: str) -> None:
    hosts = cluster_file(tmp_path)
    argv = ["agent", "--state-dir", str(tmp_path / "s"), *(a.replace("{hosts}", str(hosts)) for a in args)]
    result = CliRunner().invoke(app, argv, env={"CORRAL_NATS_URL": "nats://127.0.0.1:1"})
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output


def test_credentials_of_another_node_are_refused_before_connecting(tmp_path: Path) -> None:
    from corral.stack.up import Agents, Stack, StackOptions

    data = tmp_path / "d"
    Stack(StackOptions(data_dir=data, agents=Agents.NONE, agent_nodes=("a", "b")))._keyring(None)
    hosts = cluster_file(tmp_path)
    argv = ["agent", "--inventory", str(hosts), "--node", "a", "--state-dir", str(tmp_path / "s"),
            "--credentials", str(data / "credentials" / "agent-node-agent-b.json")]
    result = CliRunner().invoke(app, argv, env={"CORRAL_NATS_URL": "nats://127.0.0.1:1"})
    assert result.exit_code == 2 and "agent-node-agent-a" in result.output, result.output


def test_no_nats_anywhere_says_what_to_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CORRAL_NATS_URL", raising=False)
    monkeypatch.delenv("CORRAL_CONTEXT", raising=False)
    result = CliRunner().invoke(app, ["agent", "--inventory", str(cluster_file(tmp_path))])
    assert result.exit_code == 2 and "CORRAL_NATS_URL" in result.output, result.output


def test_an_unknown_flag_is_an_error_not_another_flag() -> None:
    """Issue 15: argparse turned `--cluster 4x8:H100` into `--cluster-file`; an agent that exits 2
    for it is better than one that means something else."""
    from corral.services.node_agent.__main__ import parser

    with pytest.raises(SystemExit) as exc:
        parser().parse_args(["--cluster", "4x8:H100"])
    assert exc.value.code == 2
    result = CliRunner().invoke(app, ["agent", "--inv", "x"])
    assert result.exit_code == 2 and "No such option" in result.output
