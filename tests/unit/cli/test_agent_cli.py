"""The node agent's one entry point (`corral agent`, `python -m corral.services.node_agent`): what it
hosts, the address it advertises, and one clear line (exit 2) for every flag or file that cannot
work; `corral agent` only hands its arguments and the cluster's whereabouts over. Loopback
addresses only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import corral.services.node_agent.__main__ as agent_main
from corral.cli import agent as agent_cli
from corral.cli.main import app
from corral.services.node_agent.__main__ import (
    UsageError,
    address_towards,
    check_address,
    file_inventories,
    inventories,
    main,
    parser,
)
from corral.services.node_agent.host.inventory import NvmlUnavailable


def cluster_file(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps({"nodes": [{"name": n, "gpus": 2, "model": "CPU"} for n in ("a", "b", "c")]}))
    return path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out + out.err


def test_an_inventory_file_runs_its_nodes_or_those_named(tmp_path: Path) -> None:
    path = cluster_file(tmp_path)
    assert [n.node for n in file_inventories(path, [])] == ["a", "b", "c"]
    (b,) = file_inventories(path, ["b"])
    assert b.node == "b" and len(b.gpus) == 2 and b.gpus[0].model == "CPU"
    with pytest.raises(UsageError, match=r"--node z: not in .*hosts.json \(its nodes: a, b, c\)"):
        file_inventories(path, ["z"])
    shorthand = tmp_path / "one"
    shorthand.write_text("1x4:H100\n")
    assert [len(n.gpus) for n in file_inventories(shorthand, [])] == [4]
    fake = tmp_path / "fake.yaml"
    fake.write_text("node: box\nmodel: L4\nmemory_gib: 24\ngpus: 2\nrack: r9\n")
    (box,) = file_inventories(fake, [])
    assert box.node == "box" and box.rack == "r9" and [g.memory_gib for g in box.gpus] == [24.0, 24.0]
    with pytest.raises(UsageError, match="no such file"):
        file_inventories(tmp_path / "missing.yaml", [])
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [{name: a, gpus: -1}]\n")
    with pytest.raises(UsageError, match="--inventory"):
        file_inventories(bad, [])


def test_without_a_gpu_the_default_says_to_declare_an_inventory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_main, "discover", lambda *a, **k: NvmlUnavailable("no driver"))
    with pytest.raises(UsageError, match="--inventory FILE"):
        inventories(parser().parse_args([]))
    with pytest.raises(UsageError, match="at most one --node"):
        inventories(parser().parse_args(["--inventory", "nvml", "--node", "x", "--node", "y"]))


def test_addresses() -> None:
    for good in ("127.0.0.2", "gpu-01.example.internal", "fe80::1"):
        assert check_address(good) == good
    for bad in ("127.0.0.2; rm -rf /", "two words", "", "-x"):
        with pytest.raises(UsageError, match="--advertise-address"):
            check_address(bad)
    assert address_towards("nats://127.0.0.1:4222").startswith("127.")
    assert address_towards("tls://u:p@127.0.0.3:4222,nats://127.0.0.4:4222").startswith("127.")
    with pytest.raises(UsageError, match="--advertise-address"):
        address_towards("nats://:4222")
    assert agent_main.advertised("none", "nats://127.0.0.1:4222") is None
    assert agent_main.advertised(None, "nats://127.0.0.1:4222") == address_towards("nats://127.0.0.1:4222")


@pytest.mark.parametrize(("args", "words"), [
    (["--inventory", "nope.yaml"], "no such file"),
    (["--inventory", "{hosts}", "--port-range", "30000-29000"], "--port-range"),
    (["--inventory", "{hosts}", "--port-range", "29000"], "LO-HI"),
    (["--inventory", "{hosts}", "--advertise-address", "a b"], "--advertise-address"),
    (["--inventory", "{hosts}", "--metrics-address", "nowhere"], "--metrics-address"),
    (["--inventory", "{hosts}", "--run-as", "nobody"], "--run-as"),
    (["--inventory", "{hosts}", "--runtime", "docker"], "--runtime"),
])
def test_a_flag_that_cannot_work_is_one_line_and_exit_2(tmp_path: Path, args: list[str], words: str,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CORRAL_NATS_URL", "nats://127.0.0.1:1")
    hosts = cluster_file(tmp_path)
    code, output = run(["--state-dir", str(tmp_path / "s"), *(a.replace("{hosts}", str(hosts)) for a in args)],
                       capsys)
    assert code == 2, output
    assert words in output and "Traceback" not in output


def test_credentials_of_another_node_are_refused_before_connecting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from corral.stack.up import Agents, Stack, StackOptions

    monkeypatch.setenv("CORRAL_NATS_URL", "nats://127.0.0.1:1")
    data = tmp_path / "d"
    Stack(StackOptions(data_dir=data, agents=Agents.NONE, agent_nodes=("a", "b")))._keyring(None)
    code, output = run(["--inventory", str(cluster_file(tmp_path)), "--node", "a", "--state-dir", str(tmp_path / "s"),
                        "--credentials", str(data / "credentials" / "agent-node-agent-b.json")], capsys)
    assert code == 2 and "agent-node-agent-a" in output, output


def test_no_nats_anywhere_says_what_to_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CORRAL_NATS_URL", raising=False)
    monkeypatch.delenv("CORRAL_CONTEXT", raising=False)
    code, output = run(["--inventory", str(cluster_file(tmp_path))], capsys)
    assert code == 2 and "CORRAL_NATS_URL" in output, output


def test_an_unknown_or_shortened_flag_is_an_error_not_another_flag() -> None:
    """`--cluster` is neither `--cluster-file` of `corral up` nor anything else here: exit 2."""
    for argv in (["--cluster", "4x8:H100"], ["--inv", "x"]):
        with pytest.raises(SystemExit) as exc:
            parser().parse_args(argv)
        assert exc.value.code == 2


def test_corral_agent_hands_its_arguments_and_the_cluster_to_the_agent(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    """No option of its own: every argument (even --help) is the agent's; `corral`'s --nats,
    --namespace and --context become the agent's environment."""
    ran: list[tuple[str, list[str], dict[str, str]]] = []
    monkeypatch.setattr(agent_cli.os, "execve", lambda path, argv, env: ran.append((path, argv, env)))
    args = ["--nats", "nats://10.0.0.1:4222", "--namespace", "ns", "--context", str(tmp_path),
            "agent", "--node", "a", "--inventory", "f.yaml", "--help"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    ((path, argv, env),) = ran
    assert path == sys.executable
    assert argv == [sys.executable, "-m", "corral.services.node_agent", "--node", "a", "--inventory", "f.yaml",
                    "--help"]
    assert (env["CORRAL_NATS_URL"], env["CORRAL_NAMESPACE"], env["CORRAL_CONTEXT"]) == (
        "nats://10.0.0.1:4222", "ns", str(tmp_path))


def test_corral_agent_help_is_the_agents_own() -> None:
    corral = Path(sys.executable).with_name("corral")
    done = subprocess.run([str(corral), "agent", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: corral agent") and "--advertise-address" in done.stdout
    assert "--inventory" in done.stdout and "--state-dir" in done.stdout
