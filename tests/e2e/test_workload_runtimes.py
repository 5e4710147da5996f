"""Workload runtimes end to end, on one stack (a cluster file with a shared dataset, a node-local
one and a
shared checkpoint folder, agents running real processes): a job past its `time_limit` fails
TIME_LIMIT within seconds and frees its GPUs; a job asking more host CPUs than any node's GPUs
carry is rejected, naming the need; a job mounting a node-local dataset runs on the node holding
it; a `sandbox` (bubblewrap) job reads a dataset at its mount target (below the host's read-only
/mnt), cannot write outside its mounts, sees only its GPUs (their device files too), is
preempted, checkpoints into the shared folder, resumes there and completes.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import TypeVar

import pytest

from corral.contracts import events as ev
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.lifecycle import LifecycleCode
from corral.projection import JobState
from tests.bwrap_probe import BWRAP_PROBLEM
from tests.e2e.conftest import StackFactory, connect, dump_logs, with_queues

JOB = """\
import os, sys, time
from corral import worker

worker.install()
print("dataset says", open("/mnt/data/hello.txt").read().strip(), flush=True)
try:
    open("/etc/corral-sandbox-probe", "w")
    print("write outside mounts: allowed", flush=True)
except OSError as exc:
    print("write outside mounts: refused", exc.errno, flush=True)
print("gpus", os.environ["CUDA_VISIBLE_DEVICES"], "host", os.environ.get("NVIDIA_VISIBLE_DEVICES"), flush=True)
print("devices", ",".join(sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))), flush=True)
print("cwd", os.getcwd(), flush=True)
resume = worker.resume_path()
step = int(resume.read_text()) if resume else 0
print("start step", step, flush=True)
while step < 40:
    if worker.checkpoint_requested():
        path = worker.checkpoint_dir() / "step"
        worker.atomic_write(path, str(step).encode())
        worker.report_checkpoint(path, step)
        print("checkpointed step", step, flush=True)
        worker.exit_checkpointed()
    step += 1
    time.sleep(0.1)
print("done at step", step, flush=True)
"""


PROJECT = Path(__file__).resolve().parents[2]
E = TypeVar("E", bound=ev.Event)


def events_of(trail: list[ev.Event], kind: type[E]) -> list[E]:
    return [e for e in trail if isinstance(e, kind)]


@pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=BWRAP_PROBLEM or "")
async def test_time_limit_then_a_sandboxed_job_with_a_dataset_preempted_and_resumed(
        make_stack: StackFactory, tmp_path: Path) -> None:
    dataset, shared, code = tmp_path / "datasets" / "hello", tmp_path / "shared-ckpt", tmp_path / "code"
    for folder in (dataset, shared, code):
        folder.mkdir(parents=True)
    (dataset / "hello.txt").write_text("hello from the dataset\n")
    (code / "job.py").write_text(JOB)
    cluster_file = tmp_path / "cluster.json"
    cluster_file.write_text(json.dumps({
        "checkpoint_dir": str(shared), "datasets": {"hello": str(dataset)},
        "nodes": [{"name": f"node-{i}", "gpus": 4, "model": "CPU", "cpus": 8, "host_memory_gib": 32,
                   "datasets": {"local": str(code)} if i == 1 else {}} for i in range(2)]}))
    # the node's GPUs as device files (c 1 3, /dev/null's numbers; mknod needs root)
    devices = tmp_path / "gpu-devices"
    devices.mkdir()
    if os.geteuid() == 0:
        for name in [*(f"nvidia{i}" for i in range(4)), "nvidiactl"]:
            os.mknod(devices / name, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    stack = make_stack(cluster=None, cluster_file=cluster_file, runtime="process",
                       env={"CORRAL_RELEASE_CONFIRM_SECONDS": "2", "CORRAL_GPU_DEVICES": str(devices)})
    c = await connect(stack)
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 8}], nodes=2)
        # 1. time_limit: 3s on a job that would run 60 s
        slow = await c.submit(validate_job_spec({
            "name": "slow", "queue": "team-a", "gpus_per_replica": 2, "time_limit": "3s",
            "command": ["sleep", "60"]}))
        view = await c.wait_for(lambda v: v.jobs.get(slow) is not None and v.jobs[slow].state is JobState.FAILED
                                and not v.releasing_gpus() and v.free_gpus() == 8, 60)
        reason = view.jobs[slow].reason
        assert reason is not None and reason.code == LifecycleCode.TIME_LIMIT
        trail = [e for _, e in await c.job_events(slow)]
        running = events_of(trail, ev.JobRunning)[0].occurred_at
        failed = events_of(trail, ev.JobFailed)[0].occurred_at
        assert 3.0 <= (failed - running).total_seconds() < 8.0, (running, failed)
        # its GPUs were freed: the wait above saw no releasing GPU and all 8 free (GpusReleased is on node streams)

        # 2. what no node can give is rejected, naming the need; a node-local dataset picks the node
        greedy = await c.submit(validate_job_spec({
            "name": "greedy", "queue": "team-a", "gpus_per_replica": 1, "cpus_per_replica": 4,
            "command": ["true"]}))
        view = await c.wait_for(lambda v: v.jobs.get(greedy) is not None
                                and v.jobs[greedy].state is JobState.REJECTED, 30)
        refused = str(view.jobs[greedy].reason)
        assert ">= 4 host CPUs per GPU" in refused and "its nodes give at most 2 host CPUs per GPU" in refused
        local = await c.submit(validate_job_spec({
            "name": "local", "queue": "team-a", "gpus_per_replica": 1, "runtime": "sandbox", "cpus_per_replica": 2,
            "mounts": [{"source": "local", "target": "/code"}], "command": ["cat", "/code/job.py"]}))
        view = await c.wait_for(lambda v: v.jobs.get(local) is not None
                                and v.jobs[local].state is JobState.COMPLETED, 30)
        assert view.jobs[local].nodes == ["node-1"]

        # 3. a sandboxed job: dataset at its target, no writes outside mounts, its GPUs only
        job = await c.submit(validate_job_spec({
            "name": "boxed", "queue": "team-a", "gpus_per_replica": 2, "priority": "low", "runtime": "sandbox",
            "command": [sys.executable, "/workspace/a/code/job.py"], "workdir": "/workspace/a/code",
            "mounts": [{"source": "hello", "target": "/mnt/data"}, {"source": str(code), "target": "/workspace/a/code"},
                       # this checkout (its venv's python and corral, which job.py imports), at its own path:
                       # the sandbox's /tmp is private, and a CI clone may live under /tmp
                       {"source": str(PROJECT), "target": str(PROJECT)}],
            "checkpoint": {"grace_seconds": 10}}))
        assert stack.context is not None and stack.context.log_dir
        log = Path(stack.context.log_dir) / "workers" / job / "rank-0.log"
        await c.wait_for(lambda v: log.exists() and "start step" in log.read_text(), 60)
        urgent = await c.submit(validate_job_spec({
            "name": "urgent", "queue": "team-a", "replicas": 2, "gpus_per_replica": 4, "priority": "urgent",
            "preemptible": False, "runtime": "sim", "duration_seconds": 1}))
        await c.wait_for(lambda v: v.jobs.get(urgent) is not None and v.jobs[urgent].state is JobState.COMPLETED, 60)
        view = await c.wait_for(lambda v: v.jobs[job].state is JobState.COMPLETED, 60)
        text = log.read_text()
        assert "dataset says hello from the dataset" in text
        assert "write outside mounts: refused 30" in text  # EROFS
        trail = [e for _, e in await c.job_events(job)]
        gpus = [r.gpus for e in events_of(trail, ev.GangReserved) for r in e.ranks]
        assert f"gpus 0,1 host {','.join(map(str, gpus[0]))}" in text
        if os.geteuid() == 0:  # only its own GPUs' device files, and the driver's
            assert f"devices {','.join([*sorted(f'nvidia{g}' for g in gpus[0]), 'nvidiactl'])}\n" in text
        assert "cwd /workspace/a/code" in text
        checkpoints = events_of(trail, ev.CheckpointDone)
        assert checkpoints and Path(checkpoints[0].path).parent == shared / job
        saved = int(Path(checkpoints[0].path).read_text())
        assert f"checkpointed step {saved}" in text and f"start step {saved}" in text.split("checkpointed")[1]
        assert "done at step 40" in text
        assert not (Path("/etc") / "corral-sandbox-probe").exists()
    except BaseException:
        print(dump_logs(stack))
        raise
    finally:
        await c.close()
