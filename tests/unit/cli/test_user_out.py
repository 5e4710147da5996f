"""`corral user add|rotate --out`: a folder given for the context file is refused before anything changes."""

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
