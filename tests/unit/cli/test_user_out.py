"""`corral user add|rotate --out` and `corral whoami`: bad input is one line naming the file, before any change."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli.main import app


@pytest.mark.parametrize("command", [["user", "add", "ann"], ["user", "rotate", "ann"]])
def test_an_out_that_is_a_folder_is_refused_before_any_change(tmp_path: Path, command: list[str]) -> None:
    # no cluster is named: the check comes before the installation is even looked for
    result = CliRunner().invoke(app, [*command, "--out", str(tmp_path)], env={"CORRAL_CONTEXT": str(tmp_path / "no")})
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())  # the console wraps long lines
    assert f"--out {tmp_path} is a folder" in said
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text", ["[]", "{}", '{"user": 7}'])
def test_whoami_with_a_credentials_file_that_is_not_one_says_so(tmp_path: Path, text: str) -> None:
    creds = tmp_path / "c.json"
    creds.write_text(text)
    result = CliRunner().invoke(app, ["whoami"], env={"CORRAL_NATS_URL": "nats://127.0.0.1:1",
                                                      "CORRAL_CREDENTIALS": str(creds), "CORRAL_GATEWAY": ""})
    assert result.exit_code == 1, result.output
    assert "not a credentials file" in " ".join(result.output.split())
