"""`corral server --listen ADDR`: the control plane's own NATS and Postgres on an address other
hosts reach, and an agent that joins with the command it prints (issue 15).

Before, `corral up` / `corral server` started both servers on 127.0.0.1 only: an agent on another
host could not join unless the operator ran NATS and Postgres apart. Here the control plane
listens on 127.0.0.2 (a loopback address standing for this host's address on the cluster's
network; nothing listens on 127.0.0.1) and an agent advertising 127.0.0.3 joins with the printed
files and line, over TLS with its own identity.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from corral.client import Client
from corral.stack.context import Context
from tests.e2e.test_up import start_up, stop

LISTEN, AGENT = "127.0.0.2", "127.0.0.3"


def _refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def test_a_control_plane_on_its_listen_address_is_joined_by_an_agent_with_the_printed_command(
        tmp_path: Path) -> None:
    if os.environ.get("CORRAL_NATS_URL"):
        pytest.skip("starts its own servers")
    data = tmp_path / "data"
    began = time.monotonic()
    proc, status, _ = start_up(data, tmp_path, "--agents", "none", "--listen", LISTEN, "--agent-node", "host-x")
    agent: subprocess.Popen[bytes] | None = None
    log = tmp_path / "agent.log"
    try:
        nats, pg = urlsplit(status["nats"]), urlsplit(status["postgres"])
        assert (nats.scheme, nats.hostname, pg.hostname, status["listen"]) == ("tls", LISTEN, LISTEN, LISTEN), status
        assert nats.port and pg.port and _refused("127.0.0.1", nats.port) and _refused("127.0.0.1", pg.port), \
            "the servers listen on the given address only"
        [join] = status["join"]
        assert join["node"] == "host-x" and join["env"]["CORRAL_NATS_URL"] == status["nats"], join
        assert join["argv"] == ["corral", "agent", "--node", "host-x"], join

        # The operator's steps on the agent's host: copy the two files, run the line.
        host = tmp_path / "host-x"
        moved = {}
        for item in join["copy"]:
            target = host / Path(item["to"]).relative_to("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(item["from"], target)
            moved[item["to"]] = str(target)
        assert set(moved) == {join["env"]["CORRAL_NATS_CA"], join["env"]["CORRAL_NATS_CREDENTIALS"]}
        inventory = tmp_path / "inventory.json"
        inventory.write_text(json.dumps({"nodes": [{"name": "host-x", "gpus": 2, "model": "CPU"}]}))
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        env |= {k: moved.get(v, v) for k, v in join["env"].items()}
        env |= {"CORRAL_AGENT_RUN_AS": "agent", "CORRAL_AGENT_STOP_WORKERS_ON_EXIT": "1", "PYTHONUNBUFFERED": "1"}
        with log.open("wb") as out:
            agent = subprocess.Popen(
                [sys.executable, "-m", "corral.cli.main", *join["argv"][1:], "--inventory", str(inventory),
                 "--advertise-address", AGENT, "--state-dir", str(host / "state")],
                env=env, stdout=out, stderr=subprocess.STDOUT, cwd=host)

        async def registered() -> dict[str, str | None]:
            async with await Client.connect(Context.load(data / "context.json")) as c:
                view = await c.wait_for(lambda v: "host-x" in v.nodes, 30)
                return {n: v.address for n, v in view.nodes.items()}

        assert asyncio.run(registered()) == {"host-x": AGENT}
        print(f"control plane on {LISTEN} up and joined in {time.monotonic() - began:.1f}s")
    except BaseException:
        print(log.read_text() if log.exists() else "(no agent log)")
        for name in ("placement", "admission"):
            path = data / "logs" / f"{name}.log"
            print(f"==== {name}\n" + (path.read_text()[-3000:] if path.exists() else ""))
        raise
    finally:
        if agent is not None:
            agent.terminate()
            try:
                agent.wait(20)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait(5)
        assert stop(proc) == 0
