"""A thousand nodes at a glance: `corral nodes` and `corral top` show one row per rack by default."""

from __future__ import annotations

import asyncio
import io
from typing import Any
from unittest.mock import AsyncMock

import pytest
from rich.console import Console
from typer.testing import CliRunner

from corral.cli.top_screen import render, snapshot
from corral.summary import node_rows, rack_rows
from tests.unit.cli.commands.fakes import FakeClient
from tests.unit.cli.test_unblock_hint import T0, cluster, run


@pytest.fixture(scope="module")
def big() -> Any:
    view = cluster("1000x8:H100", [])
    run(view, "jbig", "node-7", list(range(8)), None)
    return view


def test_racks_sum_their_nodes(big: Any) -> None:
    nodes = node_rows(big)
    racks = rack_rows(nodes)
    assert sum(r["nodes"] for r in racks) == 1000 and len(racks) < 1000
    assert sum(r["gpus"] for r in racks) == 8000 and sum(r["used"] for r in racks) == 8
    assert sum(r["free"] for r in racks) == 7992 and all(r["models"] == ["H100"] for r in racks)


def test_top_on_a_thousand_nodes_draws_racks_not_nodes(big: Any) -> None:
    console = Console(width=100, record=True, color_system=None)
    console.print(render(snapshot(big, T0), 100))
    screen = console.export_text()
    assert "Racks (1000 nodes" in screen and "node-999" not in screen
    assert len(screen.splitlines()) < 200


def test_nodes_on_a_thousand_nodes_is_a_rack_summary_and_filters_show_nodes(
        big: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from corral.cli import nodes_top
    from corral.cli.main import app

    rows = node_rows(big)
    client = FakeClient()
    client.view = AsyncMock(return_value=big)  # type: ignore[method-assign]
    monkeypatch.setattr(nodes_top, "with_client", lambda fn, bus=True: asyncio.run(fn(client)))
    summary = CliRunner().invoke(app, ["nodes"], env={"COLUMNS": "120"})
    assert summary.exit_code == 0, summary.output
    assert "1000 nodes in" in summary.output and "node-999" not in summary.output
    assert "--rack RACK" in summary.output
    rack = rows[7]["rack"]
    one = CliRunner().invoke(app, ["nodes", "--rack", rack], env={"COLUMNS": "200"})
    assert one.exit_code == 0 and "node-7" in one.output and "jbig" in one.output
    assert sum(1 for r in rows if r["rack"] == rack) < 64
    every = CliRunner().invoke(app, ["nodes", "--all"], env={"COLUMNS": "200"})
    assert "node-999" in every.output


@pytest.mark.parametrize("shape", ["1000x8:H100", "3x8:H100"])
def test_top_draws_its_rack_and_node_tables_as_rich_would(shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The racks and nodes of a frame are plain text (rich takes ~1 ms a row) and read the same."""
    from corral.cli import top_screen

    view = cluster(shape, [])
    run(view, "jbig", "node-1", list(range(8)), None)
    data = snapshot(view, T0)

    def drawn() -> str:
        console = Console(width=100, record=True, color_system=None, file=io.StringIO())
        console.print(render(data, 100))
        return console.export_text()

    plain = drawn()
    monkeypatch.setattr(top_screen, "plain_table", lambda *args, **kwargs: None)  # every table through rich
    assert plain == drawn()
