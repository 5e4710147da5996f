"""`corral up --agents none` (`corral server`): no simulated agents, and an identity for each node
whose agent runs elsewhere (`--agent-node`), allowed to report only for that node."""

from __future__ import annotations

import json
from pathlib import Path

from corral.stack.up import Agents, Stack, StackOptions


def test_external_agent_nodes_get_their_own_identities(tmp_path: Path) -> None:
    stack = Stack(StackOptions(data_dir=tmp_path, agents=Agents.NONE, agent_nodes=("gpu-01", "gpu-02")))
    keyring = stack._keyring(None)
    creds = json.loads((tmp_path / "credentials" / "agent-node-agent-gpu-01.json").read_text())
    assert creds["role"] == "agent" and creds["password"]
    ident = next(i for i in keyring.identities if i.user == "agent-node-agent-gpu-01")
    assert any("gpu-01" in s for s in ident.publish) and not any("gpu-02" in s for s in ident.publish)
    assert not any(i.user.startswith("agent-node-agents-") for i in keyring.identities), "no simulated agents"
    again = Stack(StackOptions(data_dir=tmp_path, agents=Agents.NONE, agent_nodes=("gpu-01",)))._keyring(None)
    assert next(i for i in again.identities if i.user == ident.user).password == ident.password, "kept"
