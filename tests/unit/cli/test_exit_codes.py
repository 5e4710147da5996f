"""The CLI's exit codes: one meaning each, as the README's table says.

Why: 3 is the code every command uses for "no cluster reachable". A script that waits and retries
on 3 (the cluster is restarting) would retry a refused change forever if `corral apply --require`
exited 3 when the evidence gate refuses a change, and one that reports a refusal would report an
outage as one."""

from __future__ import annotations

import re
from pathlib import Path

import corral.services.node_agent.__main__ as agent
from corral.cli import credentials, queue_config, session
from corral.cli.exit_codes import ExitCode

README = Path(__file__).resolve().parents[3] / "README.md"


def test_each_exit_code_has_one_meaning() -> None:
    assert len({int(code) for code in ExitCode}) == len(ExitCode)
    assert ExitCode.NO_CLUSTER == 3 and ExitCode.REFUSED == 4


def test_the_commands_use_the_shared_codes() -> None:
    assert session.EXIT_FAILURE is ExitCode.FAILURE and session.EXIT_NO_CLUSTER is ExitCode.NO_CLUSTER
    assert queue_config.EXIT_REFUSED is ExitCode.REFUSED
    assert credentials.EXIT_USAGE is ExitCode.USAGE
    assert agent.USAGE_ERROR == ExitCode.USAGE  # `corral agent` is the node agent's own entry point


def test_the_readme_names_every_code() -> None:
    text = " ".join(README.read_text().split())
    listed = re.search(r"exit codes are (.*?)\. ", text)
    assert listed is not None, "README: the sentence listing the exit codes is gone"
    for code in ExitCode:
        assert f"{int(code)} (" in listed.group(1), f"README does not say what exit {int(code)} means"
