"""GPU health end to end: two `corral agent --inventory nvml` processes, each on a fake NVML of its
own (tests/fakenvml, loaded by pynvml through `LD_LIBRARY_PATH`), with the control plane alone.

The agents register the GPUs NVML declares with their NVLink domains (NVLink peers on host-a, an
NVSwitch on host-b). A critical XID injected into the fake under a running job makes that GPU
unhealthy: the agent reports it, placement requeues the job from its checkpoint and it resumes on
the other host, `corral nodes` shows the GPU and nothing new is placed on it. An admin drains and
undrains one GPU with `corral gpu drain|undrain NODE:INDEX`; `corral audit verify` finds no GPU
allocated while out of service."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.contracts import events as ev
from corral.contracts.jobspec import validate_job_spec
from corral.projection import JobState
from corral.stack.context import CONTEXT_FILE
from corral.stack.up import Agents, Stack
from corral.summary import node_rows
from corral.verdicts import VerdictKind
from tests.e2e.conftest import StackFactory, connect, dump_logs, with_queues
from tests.fakenvml import FakeGpu, FakeNvml

HEARTBEAT_SECONDS = 2.0
HOSTS = {
    "host-a": [FakeGpu(nvlink=(1,)), FakeGpu(nvlink=(0,)), FakeGpu(nvlink=(3,)), FakeGpu(nvlink=(2,))],
    "host-b": [FakeGpu(name="NVIDIA A100-SXM4-80GB", memory_mib=81920, nvswitch=0) for _ in range(4)],
}


@pytest.fixture
def nvml_hosts(tmp_path: Path, fake_nvml_lib: Path, nats_url: str,
               namespace: str) -> Iterator[dict[str, tuple[FakeNvml, subprocess.Popen[bytes], Path]]]:
    """One `corral agent --inventory nvml` per host, each on its own fake NVML file."""
    base = 30000 + secrets.randbelow(20000)
    running: dict[str, tuple[FakeNvml, subprocess.Popen[bytes], Path]] = {}
    try:
        for i, (node, gpus) in enumerate(HOSTS.items()):
            state = tmp_path / node
            state.mkdir()
            fake = FakeNvml(fake_nvml_lib, state / "nvml.conf")
            fake.write(gpus)
            env = {**os.environ, **fake.env(), "CORRAL_NATS_URL": nats_url, "CORRAL_NAMESPACE": namespace,
                   "CORRAL_LOG_LEVEL": "INFO", "CORRAL_AGENT_STOP_WORKERS_ON_EXIT": "1",
                   "CORRAL_AGENT_RUN_AS": "agent", "PYTHONUNBUFFERED": "1"}
            for var in ("CORRAL_NATS_CREDENTIALS", "CORRAL_NATS_CA", "CORRAL_CONTEXT", "CORRAL_LOG_DIR"):
                env.pop(var, None)
            with (state / "agent.log").open("wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "corral.cli.main", "agent", "--node", node, "--inventory", "nvml",
                     "--runtime", "sim", "--advertise-address", "127.0.0.1", "--state-dir", str(state),
                     "--port-range", f"{base + 100 * i}-{base + 100 * i + 49}", "--metrics-address", "off",
                     "--heartbeat-seconds", str(HEARTBEAT_SECONDS)],
                    env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
            running[node] = (fake, proc, state)
        yield running
    finally:
        for _, proc, _ in running.values():
            proc.terminate()
        for _, proc, _ in running.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _corral(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    context = stack.options.data_dir / CONTEXT_FILE
    return subprocess.run([sys.executable, "-m", "corral.cli.main", "--context", str(context), *args],
                          capture_output=True, text=True, timeout=120)


async def test_nvml_gpus_register_and_an_unhealthy_gpu_moves_its_job_elsewhere(
        make_stack: StackFactory, nvml_hosts: dict[str, tuple[FakeNvml, subprocess.Popen[bytes], Path]]) -> None:
    stack = make_stack(cluster=None, agents=Agents.NONE)
    c = await connect(stack)
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 8}], nodes=2)
        view = await c.view()
        domains = {n: v.inventory.nvlink_domains for n, v in view.nodes.items()}
        assert domains == {"host-a": [[0, 1], [2, 3]], "host-b": [[0, 1, 2, 3]]}, "NVLink domains from NVML"
        models = {n: {(g.model, g.memory_gib) for g in v.inventory.gpus} for n, v in view.nodes.items()}
        assert models == {"host-a": {("H100", 79.6)}, "host-b": {("A100", 80.0)}}

        job = await c.submit(validate_job_spec({
            "name": "train", "queue": "team-a", "gpus_per_replica": 4, "runtime": "sim", "duration_seconds": 120,
            "env": {"CORRAL_SIM_ARGS": "--checkpoint-every 5"}}))
        view = await c.wait_for(lambda v: job in v.jobs and v.jobs[job].state is JobState.RUNNING
                                and v.jobs[job].checkpoint is not None, 90)
        first = view.jobs[job].ranks[0].node
        other = next(n for n in HOSTS if n != first)
        fake = nvml_hosts[first][0]

        fake.add_xid(1, 13)  # an application XID: nothing happens
        injected = time.time()
        fake.add_xid(1, 79)  # GPU has fallen off the bus: critical
        view = await c.wait_for(lambda v: 1 in v.nodes[first].unhealthy, 30)
        problem = view.nodes[first].unhealthy[1]
        assert (problem.code, problem.xid) == ("XID", 79)
        (_, reported), = await c.events(types=["GpuHealthChanged"])
        print(f"GPU {first}:1 reported unhealthy {reported.occurred_at.timestamp() - injected:.2f} s after the XID "
              f"(heartbeat {HEARTBEAT_SECONDS:g} s)")

        view = await c.wait_for(lambda v: v.jobs[job].state is JobState.RUNNING and v.jobs[job].attempt == 1, 90)
        trail = [e for _, e in await c.job_events(job)]
        released = [e for e in trail if isinstance(e, ev.GangReleased)]
        assert released[0].reason.code == "GPU_UNHEALTHY" and f"{first}:1" in released[0].reason.message
        requeued = [e for e in trail if isinstance(e, ev.JobRequeued)]
        assert requeued[0].reason.code == "GPU_UNHEALTHY" and requeued[0].resume_from is not None
        gangs = [e for e in trail if isinstance(e, ev.GangReserved)]
        assert {r.node for r in gangs[1].ranks} == {other}, "resumed on the other host"
        assert gangs[1].resume_from == requeued[0].resume_from, "from its checkpoint"

        row = next(r for r in node_rows(view) if r["node"] == first)  # what `corral nodes --json` prints
        assert row["unhealthy"]["1"]["code"] == "XID" and row["free"] == 3
        assert " X " in f" {row['map']} ", row["map"]

        # a job needing four GPUs waits: host-a's fourth is out, host-b is busy
        second = await c.submit(validate_job_spec({"name": "four", "queue": "team-a", "gpus_per_replica": 4,
                                                   "runtime": "sim", "duration_seconds": 5}))
        view = await c.wait_for(lambda v: second in v.jobs and v.jobs[second].reason is not None, 30)
        assert view.jobs[second].state is JobState.PENDING and not view.jobs[second].holding

        # an admin drains a GPU of the host the job runs on: it runs on; undrained, it is free again
        drained = _corral(stack, "gpu", "drain", f"{other}:2", "-m", "flaky NVLink", "--json")
        assert drained.returncode == 0 and json.loads(drained.stdout)["verdict"] == "done", drained
        view = await c.wait_for(lambda v: 2 in v.nodes[other].drained_gpus, 15)
        assert view.nodes[other].drained_gpus[2].message == "flaky NVLink"
        assert view.jobs[job].state is JobState.RUNNING and view.jobs[job].attempt == 1
        listed = _corral(stack, "nodes")
        assert f"{other}:2 drained (D) by" in listed.stdout and f"{first}:1 unhealthy (X)" in listed.stdout, listed
        undrained = await c.await_verdict(await c.drain_gpu(other, 2, undrain=True), 15)
        assert undrained.kind is VerdictKind.DONE
        await c.wait_for(lambda v: not v.nodes[other].drained_gpus, 15)
        # the whole log: no GPU was allocated while out of service (nor held twice, ...)
        verified = _corral(stack, "audit", "verify", "--json")
        assert json.loads(verified.stdout)["violations_by_invariant"] == {}, verified.stdout[-2000:]
    except BaseException:
        print(dump_logs(stack))
        for node, (_, _, state) in nvml_hosts.items():
            print(f"==== agent {node}\n" + (state / "agent.log").read_text()[-4000:])
        raise
    finally:
        await c.close()
