"""`corral gpu drain|undrain NODE:INDEX`: how a GPU is named."""

from __future__ import annotations

import pytest
import typer

from corral.cli.gpu import parse_target


def test_a_gpu_is_named_node_colon_index() -> None:
    assert parse_target("node-3:5") == ("node-3", 5)
    assert parse_target("host.a:b:0") == ("host.a:b", 0)
    for bad in ("node-3", ":5", "node-3:", "node-3:x", "node-3:-1"):
        with pytest.raises(typer.BadParameter, match="give NODE:INDEX"):
            parse_target(bad)
