"""Multi-host acceptance on hosts that are network namespaces (tests/netns.py): the control plane
(`corral server --listen`) on one host, `corral agent` on three others joined with the line the
server printed, the test's client and CLI on a fifth (a login host). Each host has its own network
stack, so an address advertised wrong, a server on the wrong interface or a host cut off from the
others shows as it would on real machines.

One cluster serves the module; each test leaves every GPU free and every host up. Skipped, with
the reason, where namespaces cannot be made (not root, no `ip`)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from corral.cli.commands.audit import read_log
from corral.contracts import events as ev
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.logs import LogChunk
from corral.core.rendezvous import AGENT_PORT_RANGE
from corral.log_stream import LogQuery, read_chunks
from corral.projection import ClusterView, JobState, JobView
from tests.e2e import netns_cluster
from tests.e2e.netns_cluster import AGENT_HOSTS, LOGIN, SERVER, NetnsCluster
from tests.netns import NamespaceLoop, NamespacesUnavailable, Network, unavailable_reason
from tests.processes import alive

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason())),
    pytest.mark.skipif(bool(os.environ.get("CORRAL_NATS_URL")), reason="starts its own servers"),
]
needs_torch = pytest.mark.skipif(not any(Path(p, "torch").exists() for p in sys.path), reason="torch is not installed")


@pytest.fixture(scope="module")
def hosts() -> Iterator[NetnsCluster]:
    net = Network([SERVER, LOGIN, *AGENT_HOSTS])
    # Not under pytest's basetemp: a concurrent pytest session resets its root to 0700, which
    # shuts out the Postgres system account `corral server` runs Postgres as.
    root = Path(tempfile.mkdtemp(prefix="corral-netns-"))
    try:
        try:
            net.create()
        except NamespacesUnavailable as exc:
            pytest.skip(str(exc))
        yield from netns_cluster.start(net, root)
    finally:
        net.destroy()
        shutil.rmtree(root, ignore_errors=True)


def _wait_job(cluster: NetnsCluster, job: str, what: Callable[[JobView], bool], timeout: float) -> ClusterView:
    assert cluster.client is not None
    view: ClusterView = cluster.run(cluster.client.wait_for(lambda v: job in v.jobs and what(v.jobs[job]), timeout))
    return view


async def _refused(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection(host, port)
    except ConnectionRefusedError:
        return True
    writer.close()
    return False


def test_the_server_listens_on_its_hosts_address_and_agents_join_with_the_printed_line(
        hosts: NetnsCluster) -> None:
    status, server = hosts.status, hosts.address(SERVER)
    nats, pg = urlsplit(status["nats"]), urlsplit(status["postgres"])
    assert (nats.scheme, nats.hostname, pg.hostname, status["listen"]) == ("tls", server, server, server), status
    assert nats.port and pg.port
    on_server = NamespaceLoop(hosts.net.hosts[SERVER].netns)
    try:
        assert on_server.run(_refused("127.0.0.1", nats.port)) and on_server.run(_refused("127.0.0.1", pg.port)), \
            "the servers listen on the given address only"
    finally:
        on_server.close()
    for join in status["join"]:
        assert join["env"]["CORRAL_NATS_URL"] == status["nats"], join
        assert join["argv"] == ["corral", "agent", "--node", join["node"]], join
        assert {join["env"]["CORRAL_NATS_CA"], join["env"]["CORRAL_NATS_CREDENTIALS"]} == \
            {item["to"] for item in join["copy"]}, join
    assert hosts.client is not None
    view = hosts.run(hosts.client.view())
    assert {n: v.address for n, v in view.nodes.items()} == {h: hosts.address(h) for h in AGENT_HOSTS}, \
        "each agent advertises its own host's address, found towards NATS"
    cli = subprocess.run(hosts.net.command(LOGIN, [netns_cluster.corral(), "--context", str(hosts.data), "nodes",
                                                   "--json"]),
                         capture_output=True, text=True, timeout=60, env=netns_cluster.clean_env(hosts.root))
    assert cli.returncode == 0, cli.stderr
    assert all(h in cli.stdout for h in AGENT_HOSTS), "the CLI on another host reads the log over the network"


@needs_torch
def test_ddp_of_2_hosts_x_2_ranks_meets_at_rank_0s_host_address(hosts: NetnsCluster) -> None:
    c = hosts.client
    assert c is not None
    ddp = hosts.run(c.submit(validate_job_spec({
        "name": "ddp", "queue": "team-a", "replicas": 4, "gpus_per_replica": 1, "runtime": "process",
        "env": {"OMP_NUM_THREADS": "1"},
        "command": [sys.executable, str(ROOT / "examples" / "ddp_allreduce.py"), "--steps", "10",
                    "--step-seconds", "0.02"]})))
    began = time.monotonic()
    try:
        view = hosts.run(c.wait_for(lambda v: ddp in v.jobs and v.jobs[ddp].state.terminal, 90))
        print(f"ddp of 2 hosts x 2 ranks ended in {time.monotonic() - began:.1f}s")
    except TimeoutError:
        view = hosts.run(c.view())
        job = view.jobs.get(ddp)
        raise AssertionError(f"ddp did not end in 90s: {job and (job.state, job.reason, job.ranks)}\n"
                             f"{_rank_logs(hosts, ddp)}\n{hosts.logs()}") from None
    job = view.jobs[ddp]
    if job.state is not JobState.COMPLETED:
        pytest.fail(f"{job.state} {job.reason}\n{_rank_logs(hosts, ddp)}")
    by_rank = {r.rank: r.node for r in job.ranks}
    assert len(set(by_rank.values())) == 2 and sorted(by_rank.values()).count(by_rank[0]) == 2, \
        f"2 hosts x 2 ranks: {by_rank}"
    seen = {}
    for rank, node in by_rank.items():
        text = (hosts.agents[node].state / "logs" / ddp / f"rank-{rank}.log").read_text()
        found = re.search(r"rendezvous (\S+):(\d+)", text)
        assert found is not None, text
        seen[rank] = (found.group(1), int(found.group(2)))
        assert f"rank {rank} done at step 10" in text, text
    master = hosts.address(by_rank[0])
    [reserved] = [e for _, e in _trail(hosts, ddp) if isinstance(e, ev.GangReserved)]
    assert reserved.master_addr == master
    port = seen[0][1]
    assert seen == dict.fromkeys(by_rank, (master, port)), f"every rank met at rank 0's host {master}: {seen}"
    low, high = AGENT_PORT_RANGE
    assert low <= port <= high, f"MASTER_PORT {port} is from {by_rank[0]}'s rendezvous ports"
    # The same lines from the bus, each rank's from the agent of its host.
    chunks: list[LogChunk] = []
    hosts.run(read_chunks(c.bus, LogQuery(ddp), chunks.append))
    for rank, node in by_rank.items():
        assert any(f"rank {rank} done at step 10" in line for ch in chunks if (ch.rank, ch.node) == (rank, node)
                   for line in ch.lines), [(ch.rank, ch.node, ch.lines[-1:]) for ch in chunks]
    _free(hosts)
    hosts.run(c.wait_for(lambda v: not v.ports, 15))  # given back once rank 0's host released its GPUs


def _trail(cluster: NetnsCluster, job: str) -> list[tuple[int, ev.Event]]:
    assert cluster.client is not None
    return [(stored.position, e) for stored, e in cluster.run(cluster.client.job_events(job))]


def _free(cluster: NetnsCluster) -> None:
    """Every GPU free and every host up again (the next test's starting point)."""
    assert cluster.client is not None
    cluster.run(cluster.client.wait_for(lambda v: not any(n.allocations or n.lost for n in v.nodes.values()), 30))


def test_an_agent_restarted_on_its_host_adopts_its_running_stepd(hosts: NetnsCluster) -> None:
    c = hosts.client
    assert c is not None
    done = hosts.root / "adopted-may-end"  # the rank runs until the test says
    job = hosts.run(c.submit(validate_job_spec({
        "name": "adopted", "queue": "team-a", "gpus_per_replica": 2, "runtime": "process",
        "command": [sys.executable, "-c", f"import os, time\nwhile not os.path.exists({str(done)!r}): "
                                          "time.sleep(0.05)"]})))
    _wait_job(hosts, job, lambda j: j.state is JobState.RUNNING, 60)
    [started] = [e for _, e in _trail(hosts, job) if isinstance(e, ev.WorkerStarted)]
    hosts.restart_agent(started.node)  # at once: back within the node-lost limit, the node is never lost
    assert alive(started.pid), "the rank outlives its agent, under its stepd"
    done.touch()
    try:
        view = _wait_job(hosts, job, lambda j: j.state.terminal, 60)
    except TimeoutError:
        raise AssertionError(hosts.logs()) from None
    assert view.jobs[job].state is JobState.COMPLETED and view.jobs[job].attempt == 0, hosts.logs()
    exits = [e for _, e in _trail(hosts, job) if isinstance(e, ev.WorkerExited)]
    assert [(e.node, e.attempt, e.exit_code) for e in exits] == [(started.node, 0, 0)], exits
    agent = hosts.agents[started.node]
    assert f"adopted {job} attempt 0" in agent.log.read_text(), agent.logs()
    _free(hosts)


def test_a_host_cut_off_is_lost_its_gang_resumes_elsewhere_and_its_gpus_wait_for_its_old_rank(
        hosts: NetnsCluster) -> None:
    c = hosts.client
    assert c is not None
    job = hosts.run(c.submit(validate_job_spec({
        "name": "resumes", "queue": "team-a", "replicas": 2, "gpus_per_replica": 2, "runtime": "sim",
        "duration_seconds": 60, "env": {"CORRAL_SIM_ARGS": "--checkpoint-every 5"}})))
    _wait_job(hosts, job, lambda j: j.state is JobState.RUNNING, 60)
    for _ in range(100):  # rank 0 checkpoints every 0.5 s
        if any(isinstance(e, ev.CheckpointDone) for _, e in _trail(hosts, job)):
            break
        time.sleep(0.1)
    [old] = [e for _, e in _trail(hosts, job) if isinstance(e, ev.WorkerStarted) and e.rank == 0]
    mark = max(p for p, _ in _trail(hosts, job))
    cut = old.node  # rank 0's host: it goes on checkpointing, unheard, while the gang runs elsewhere
    hosts.net.cut(cut)
    try:
        view = _wait_job(hosts, job, lambda j: j.attempt >= 1 and j.state is JobState.RUNNING, 60)
        assert view.nodes[cut].lost
        assert alive(old.pid), "nothing told the cut-off host: its rank runs on"
        assert set(view.nodes[cut].allocations.values()) == {job}, \
            "the lost host's GPUs stay held by the released attempt"
    finally:
        hosts.net.mend(cut)
    running = view.jobs[job].attempt  # 1, unless the loaded machine made another host miss heartbeats
    trail = _trail(hosts, job)
    lost = [e for stored, e in hosts.run(c.events(types=["NodeLost"])) if e.node == cut and stored.position > mark]
    assert lost and lost[0].reason.code == "HEARTBEAT_MISSED"
    requeued_at, requeued = next((p, e) for p, e in trail if isinstance(e, ev.JobRequeued) and p > mark)
    before = [e.path for p, e in trail if isinstance(e, ev.CheckpointDone) and e.attempt == 0 and p < requeued_at]
    assert requeued.reason.code == "NODE_LOST" and requeued.resume_from == before[-1], (requeued, before)
    second = [e for _, e in trail if isinstance(e, ev.GangReserved) and e.attempt == requeued.attempt]
    assert second and second[0].resume_from == requeued.resume_from
    assert cut not in {r.node for r in second[0].ranks}

    # Back on the network: the only free GPUs are the cut-off host's, and they are placed again
    # only once its old rank is gone (the fence); that rank's late reports change nothing.
    after = hosts.run(c.submit(validate_job_spec({
        "name": "after", "queue": "team-a", "gpus_per_replica": 2, "runtime": "sim", "duration_seconds": 1})))
    _wait_job(hosts, after, lambda j: j.state.terminal, 60)
    trail = _trail(hosts, job)
    [gone] = [p for p, e in trail if isinstance(e, ev.WorkerExited) and e.attempt == 0 and e.node == cut]
    [(placed, reserved)] = [(p, e) for p, e in _trail(hosts, after) if isinstance(e, ev.GangReserved)]
    assert {r.node for r in reserved.ranks} == {cut}
    assert placed > gone, f"{after} placed on {cut} (position {placed}) before the old rank's exit ({gone})"
    assert not alive(old.pid)
    view = hosts.run(c.view())
    assert view.jobs[job].attempt == running and view.jobs[job].state is JobState.RUNNING, \
        "the late reports moved nothing"
    late = [e.path for p, e in trail if isinstance(e, ev.CheckpointDone) and e.attempt == 0 and p > requeued_at]
    print(f"checkpoints of attempt 0 reported by {cut} once back: {len(late)}")
    assert f"attempt{running}-" in (view.jobs[job].checkpoint or ""), "the resume point is the current attempt's"
    report, undecodable = hosts.run(read_log(hosts.dsn(), 60.0))
    assert undecodable == 0 and not report.violations, report.violations
    hosts.run(c.cancel(job))
    _free(hosts)


def _rank_logs(cluster: NetnsCluster, job: str) -> str:
    out = []
    for agent in cluster.agents.values():
        for path in sorted((agent.state / "logs" / job).glob("rank-*.log")):
            out.append(f"==== {agent.host} {path.stem}\n" + path.read_text(errors="replace")[-5000:])
    return "\n".join(out)

