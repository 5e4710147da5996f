"""Containerized ranks for real: `runtime: docker` (Docker Engine, Debian's docker.io, a private
dockerd) and `runtime: podman` (with runc), on one `corral up` stack whose agents run ranks as their
submitters. The image is made here without a registry (`tests/container_engines.py`: this machine's
Python, imported once per session); the job mounts the checkout (and so the venv) read-only, a
dataset read-only below /mnt, and a writable output folder; it runs as the submitter (`--user`),
sees its GPUs as device files (`CORRAL_GPU_DEVICES`: a folder of `mknod` files the test owns,
given as `--device`), writes a checkpoint into its checkpoint folder and completes. A DDP pair
(gloo) runs across two containers.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from corral.client import Client
from corral.contracts import events as ev
from corral.contracts.jobspec import validate_job_spec
from corral.projection import JobState
from corral.stack.context import Context
from corral.stack.up import Stack
from tests.container_engines import Engine, docker_engine, podman_engine
from tests.e2e.conftest import dump_logs, own_site

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="rootful containers and mknod need root")

PROJECT = Path(__file__).resolve().parents[2]
#: The checkout and the venv (when it lies elsewhere): the job runs the code under test.
CODE = [PROJECT, *([] if Path(sys.prefix).is_relative_to(PROJECT) else [Path(sys.prefix)])]
SUBMITTER = "nobody"

JOB = """\
import os, sys
from corral import worker

worker.install()
print("dataset says", open("/mnt/data/hello.txt").read().strip(), flush=True)
print("uid", os.getuid(), "gid", os.getgid(), flush=True)
nodes = sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))
print("devices", ",".join(nodes), "cuda", os.environ["CUDA_VISIBLE_DEVICES"],
      "host", os.environ["NVIDIA_VISIBLE_DEVICES"], flush=True)
path = worker.checkpoint_dir() / "step"
worker.atomic_write(path, b"7")
worker.report_checkpoint(path, 7)
with open(f"/workspace/out/{os.environ['CORRAL_JOB_ID']}.txt", "w") as out:
    out.write(f"written by {os.getuid()}")
print("done", flush=True)
"""


@pytest.fixture(scope="session")
def docker() -> Iterator[Engine]:
    folder = Path(tempfile.mkdtemp(prefix="corral-dockerd-"))  # short: containerd's socket paths
    with docker_engine(folder) as engine:
        yield engine


@pytest.fixture(scope="session")
def podman() -> Iterator[Engine]:
    folder = Path(tempfile.mkdtemp(prefix="corral-podman-"))
    try:
        yield podman_engine(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def gpu_devices() -> Iterator[Path]:
    """Fake GPU device files: `nvidia0..7` and `nvidiactl`, all /dev/null's numbers (c 1 3)."""
    folder = Path(tempfile.mkdtemp(prefix="corral-fake-gpus-"))
    for name in [*(f"nvidia{i}" for i in range(8)), "nvidiactl"]:
        os.mknod(folder / name, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
async def site(postgres_server_dsn: str, docker: Engine, podman: Engine, gpu_devices: Path) -> AsyncIterator[Stack]:
    """2 nodes x 8 GPUs, ranks as their submitters, GPUs as the fake device files; the engines'
    client settings in the agents' environment."""
    env = {"CORRAL_AGENT_RUN_AS": "submitter", "CORRAL_GPU_DEVICES": str(gpu_devices), **docker.env, **podman.env}
    async with own_site(postgres_server_dsn, "corral-containers-", data_mode=0o755, env=env, runtime="process",
                        write_user_context=False, submitters=(SUBMITTER,)) as stack:
        yield stack


async def client_of(stack: Stack) -> Client:
    ctx, data = stack.context, stack.options.data_dir
    assert ctx is not None
    return await Client.connect(Context(nats_url=ctx.nats_url, postgres_dsn=ctx.postgres_dsn, namespace="corral",
                                        nats_ca=ctx.nats_ca,
                                        credentials=str(data / "credentials" / f"{SUBMITTER}.json")))


@pytest.fixture(params=["docker", "podman"])
def engine(request: pytest.FixtureRequest, docker: Engine, podman: Engine) -> Engine:
    found = docker if request.param == "docker" else podman
    if found.problem is not None:
        pytest.skip(found.problem)
    return found


async def test_a_containerized_rank_with_mounts_its_user_its_gpus_and_a_checkpoint(engine: Engine, site: Stack) -> None:
    engine_name, stack = engine.name, site
    nobody = pwd.getpwnam(SUBMITTER)
    work = Path(tempfile.mkdtemp(prefix="corral-ctr-job-"))
    try:
        work.chmod(0o755)
        (work / "data").mkdir()
        (work / "data" / "hello.txt").write_text("hello from the dataset\n")
        (work / "out").mkdir()
        os.chown(work / "out", nobody.pw_uid, nobody.pw_gid)
        c = await client_of(stack)
        try:
            job = await c.submit(validate_job_spec({
                "name": f"boxed-{engine_name}", "queue": "team-a", "gpus_per_replica": 2, "runtime": engine_name,
                "image": engine.image, "command": [sys.executable, "-c", JOB],
                "mounts": [*({"source": str(p), "target": str(p)} for p in CODE),
                           {"source": str(work / "data"), "target": "/mnt/data"},
                           {"source": str(work / "out"), "target": "/workspace/out", "read_only": False}]}))
            view = await c.wait_for(lambda v: v.jobs.get(job) is not None and v.jobs[job].state in (
                JobState.COMPLETED, JobState.FAILED), 90)
            assert stack.context is not None and stack.context.log_dir
            text = "\n".join(p.read_text() for p in (Path(stack.context.log_dir) / "workers" / job).glob("rank-*.log"))
            assert view.jobs[job].state is JobState.COMPLETED, text
            trail = [e for _, e in await c.job_events(job)]
        finally:
            await c.close()
        assert "dataset says hello from the dataset" in text
        assert f"uid {nobody.pw_uid} gid {nobody.pw_gid}" in text
        gpus = [g for e in trail if isinstance(e, ev.GangReserved) for r in e.ranks for g in r.gpus]
        host = ",".join(map(str, gpus))
        assert f"devices {','.join([*sorted(f'nvidia{g}' for g in gpus), 'nvidiactl'])} cuda 0,1 host {host}" in text
        checkpoints = [e for e in trail if isinstance(e, ev.CheckpointDone)]
        assert checkpoints and Path(checkpoints[0].path).read_text() == "7"
        assert (work / "out" / f"{job}.txt").read_text() == f"written by {nobody.pw_uid}"
        assert engine.run("ps", "--all", "--quiet", "--filter", f"name=corral-{job}").stdout.strip() == ""
    except BaseException:
        print(dump_logs(stack))
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def first_engine(docker: Engine, podman: Engine) -> Engine:
    """Docker, else podman: one engine is enough for what does not differ between them."""
    for found in (docker, podman):
        if found.problem is None:
            return found
    pytest.skip(f"no container engine: {docker.problem}; {podman.problem}")


@pytest.mark.skipif(not any(Path(p, "torch").exists() for p in sys.path), reason="torch is not installed")
async def test_a_ddp_pair_across_two_containers(first_engine: Engine, site: Stack) -> None:
    """examples/ddp_allreduce.py, 2 ranks on gloo, each in its own container (host network: they
    meet at rank 0's address), all-reduces to the end. Its time is torch's import, twice."""
    engine = first_engine
    c = await client_of(site)
    try:
        job = await c.submit(validate_job_spec({
            "name": f"ddp-{engine.name}", "queue": "team-a", "replicas": 2, "gpus_per_replica": 1,
            "runtime": engine.name, "image": engine.image, "env": {"OMP_NUM_THREADS": "1"},
            "mounts": [{"source": str(p), "target": str(p)} for p in CODE],
            "command": [sys.executable, str(PROJECT / "examples" / "ddp_allreduce.py"), "--steps", "8",
                        "--step-seconds", "0.05"]}))
        view = await c.wait_for(lambda v: v.jobs.get(job) is not None and v.jobs[job].state in (
            JobState.COMPLETED, JobState.FAILED), 120)
        assert site.context is not None and site.context.log_dir
        logs = [Path(site.context.log_dir) / "workers" / job / f"rank-{r}.log" for r in range(2)]
        text = "\n".join(p.read_text() for p in logs if p.exists())
        assert view.jobs[job].state is JobState.COMPLETED, text
        trail = [e for _, e in await c.job_events(job)]
    except BaseException:
        print(dump_logs(site))
        raise
    finally:
        await c.close()
    started = [e for e in trail if isinstance(e, ev.WorkerStarted)]
    assert sorted(e.rank for e in started) == [0, 1]
    for rank, path in enumerate(logs):
        body = path.read_text()
        assert f"rank {rank} of 2 on node" in body and f"rank {rank} done at step 8" in body, body
