"""A cluster of hosts: the control plane alone (`corral up --agents none`) and three `corral agent`
processes, each a "host" advertising its own loopback address (127.0.0.2-4; loopback only).

Issue 15: every gang's MASTER_ADDR was 127.0.0.1, whatever host its rank 0 ran on, so a gang
across hosts could not rendezvous. Here a real DDP job (gloo on CPU) of 2 nodes x 2 ranks meets at
rank 0's node's advertised address and a port of that node's range, and completes."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from corral.contracts.jobspec import validate_job_spec
from corral.contracts.logs import LogChunk
from corral.log_stream import LogQuery, read_chunks
from corral.projection import JobState
from corral.stack.up import Agents
from tests.e2e.conftest import StackFactory, connect, dump_logs, with_queues

ROOT = Path(__file__).resolve().parents[2]
HOSTS = {"host-a": "127.0.0.2", "host-b": "127.0.0.3", "host-c": "127.0.0.4"}

pytestmark = pytest.mark.skipif(not any(Path(p, "torch").exists() for p in sys.path),
                                reason="torch is not installed")


@dataclass
class Host:
    state: Path  # its --state-dir (rank logs in logs/<job>/)
    proc: subprocess.Popen[bytes]
    ports: range  # its --port-range


@pytest.fixture
def agents(tmp_path: Path, nats_url: str, namespace: str) -> Iterator[dict[str, Host]]:
    """Three `corral agent` processes, one per host, with a declared (fake) inventory of 2 GPUs each."""
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps({"nodes": [{"name": n, "gpus": 2, "model": "CPU"} for n in HOSTS]}))
    base = 30000 + secrets.randbelow(20000)  # a range of its own: tests may run side by side
    env = {**os.environ, "CORRAL_NATS_URL": nats_url, "CORRAL_NAMESPACE": namespace, "CORRAL_LOG_LEVEL": "INFO",
           "CORRAL_AGENT_STOP_WORKERS_ON_EXIT": "1", "CORRAL_AGENT_RUN_AS": "agent", "PYTHONUNBUFFERED": "1"}
    for var in ("CORRAL_NATS_CREDENTIALS", "CORRAL_NATS_CA", "CORRAL_CONTEXT", "CORRAL_LOG_DIR"):
        env.pop(var, None)
    running: dict[str, Host] = {}
    try:
        for i, (node, address) in enumerate(HOSTS.items()):
            state = tmp_path / node
            state.mkdir()
            ports = range(base + 100 * i, base + 100 * i + 50)
            with (state / "agent.log").open("wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "corral.cli.main", "agent", "--node", node, "--inventory", str(inventory),
                     "--advertise-address", address, "--state-dir", str(state),
                     "--port-range", f"{ports[0]}-{ports[-1]}"],
                    env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
            running[node] = Host(state, proc, ports)
        yield running
    finally:
        for host in running.values():
            host.proc.terminate()
        for host in running.values():
            try:
                host.proc.wait(20)
            except subprocess.TimeoutExpired:
                host.proc.kill()
                host.proc.wait(5)


async def test_ddp_across_three_agents_meets_at_rank_0s_node_address(
        make_stack: StackFactory, agents: dict[str, Host]) -> None:
    stack = make_stack(cluster=None, runtime="process", agents=Agents.NONE)
    assert [p.name for p in stack.processes if p.name == "node-agents"] == [], "the control plane only"
    c = await connect(stack)
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 6}], nodes=3)
        view = await c.view()
        assert {n: v.address for n, v in view.nodes.items()} == HOSTS, "each agent registered its address"
        ddp = await c.submit(validate_job_spec({
            "name": "ddp", "queue": "team-a", "replicas": 4, "gpus_per_replica": 1, "runtime": "process",
            # gloo's own sockets on loopback too (its default follows the host name)
            "env": {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"},
            "command": [sys.executable, str(ROOT / "examples" / "ddp_allreduce.py"), "--steps", "10",
                        "--step-seconds", "0.02"]}))
        try:
            view = await c.wait_for(lambda v: v.jobs.get(ddp) is not None and v.jobs[ddp].state.terminal, 90)
        except TimeoutError:
            view = await c.view()
            job = view.jobs.get(ddp)
            raise AssertionError(f"ddp did not end in 90s: {job and (job.state, job.reason, job.ranks)}") from None
        job = view.jobs[ddp]
        assert job.state is JobState.COMPLETED, (job.state, job.reason)
        by_rank = {r.rank: r.node for r in job.ranks}
        assert len(set(by_rank.values())) == 2 and sorted(by_rank.values()).count(by_rank[0]) == 2, \
            f"2 nodes x 2 ranks: {by_rank}"
        master = HOSTS[by_rank[0]]
        seen = {}
        for rank, node in by_rank.items():
            text = (agents[node].state / "logs" / ddp / f"rank-{rank}.log").read_text()
            found = re.search(r"rendezvous (\S+):(\d+)", text)
            assert found is not None, text
            seen[rank] = (found.group(1), int(found.group(2)))
            assert f"rank {rank} done at step 10" in text, text
        # The same lines from the bus, each rank's from the agent of its node (issue 16).
        chunks: list[LogChunk] = []
        await read_chunks(c.bus, LogQuery(ddp), chunks.append)
        for rank, node in by_rank.items():
            assert any(f"rank {rank} done at step 10" in line for ch in chunks if (ch.rank, ch.node) == (rank, node)
                       for line in ch.lines), [(ch.rank, ch.node, ch.lines[-1:]) for ch in chunks]
        port = seen[0][1]
        assert seen == dict.fromkeys(by_rank, (master, port)), f"every rank met at rank 0's node {master}: {seen}"
        assert port in agents[by_rank[0]].ports, f"MASTER_PORT {port} is from {by_rank[0]}'s --port-range"
        await c.wait_for(lambda v: not v.ports, 15)  # given back once rank 0's node released the GPUs
    except BaseException:
        print(dump_logs(stack))
        for node, host in agents.items():
            print(f"==== agent {node}\n" + (host.state / "agent.log").read_text()[-4000:])
        raise
    finally:
        await c.close()
