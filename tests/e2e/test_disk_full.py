"""A full disk is a fault of the machine: nothing accepted is lost, no success becomes a failure,
and once space is back the cluster resumes without a restart.

Each folder that can fill (the NATS store, the agent's state folder, the rank log folder) gets
its own small tmpfs, so each fault is exact: the file that fills it fills only that folder.
Mounting needs root (the CI machine has it); elsewhere the tests are skipped with that reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.contracts.jobspec import validate_job_spec
from corral.projection import JobState
from corral.stack.up import Stack, StackOptions
from tests.e2e.conftest import StackFactory, connect, dump_logs, with_queues

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import disk_faults

_NO_MOUNT = disk_faults.can_mount()
pytestmark = pytest.mark.skipif(_NO_MOUNT is not None, reason=f"needs a tmpfs of its own: {_NO_MOUNT}")


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """`path` as a tmpfs of `size` (e.g. "2m") for the duration of the block."""
    disk_faults.mount(path, size)
    try:
        yield path
    finally:
        disk_faults.unmount(path)


def job(name: str, seconds: float, gpus: int = 1) -> object:
    return validate_job_spec({"name": name, "queue": "team-a", "runtime": "sim", "duration_seconds": seconds,
                              "gpus_per_replica": gpus})


QUEUES = [{"name": "team-a", "guaranteed_gpus": 8, "max_gpus": 8}]


# --- the agent's state folder -------------------------------------------------------------------

async def test_jobs_that_exit_0_while_the_agent_state_folder_is_full_are_completed(
        make_stack: StackFactory, tmp_path: Path) -> None:
    """The agent's state folder is full: the stepds cannot write their state while their ranks exit 0.
    Each exit is kept and written once space is back; every job is COMPLETED, none CRASHED."""
    run = tmp_path / "stack0" / "nodes" / "node-0" / "run"
    with tmpfs(run, "1m"):
        stack = make_stack(cluster="1x8:H100")
        client = await connect(stack)
        try:
            await with_queues(client, QUEUES, nodes=1)
            jobs = [await client.submit(job(f"full-{i}", 4.0)) for i in range(4)]  # type: ignore[arg-type]
            await client.wait_for(lambda v: all(v.jobs[j].state is JobState.RUNNING for j in jobs if j in v.jobs)
                                  and all(j in v.jobs for j in jobs), 60)
            filler = disk_faults.fill(run)
            logs = Path(stack.context.log_dir if stack.context else "") / "workers"

            def exited() -> bool:
                return all("==== exited with code 0 ====" in (logs / j / "rank-0.log").read_text(errors="replace")
                           for j in jobs)

            deadline = time.monotonic() + 60
            while not exited():  # every rank has exited 0 while nothing could be written
                assert time.monotonic() < deadline, dump_logs(stack)
                await asyncio.sleep(0.2)
            await asyncio.sleep(2.0)  # the agent checks its stepds every 0.5 s: let it look while full
            filler.unlink()
            try:
                view = await client.wait_for(lambda v: all(v.jobs[j].state.terminal for j in jobs), 60)
            except TimeoutError:
                pytest.fail("not every job ended after space was back:\n" + dump_logs(stack))
            states = {j: (view.jobs[j].state, view.jobs[j].reason) for j in jobs}
            assert all(s is JobState.COMPLETED for s, _ in states.values()), f"{states}\n{dump_logs(stack)}"
            exits = [e for j in jobs for e in await client.store.read_stream(f"job-{j}") if e.type == "WorkerExited"]
            assert exits and not [e for e in exits if b"stepd" in e.data], [e.data for e in exits]
        finally:
            await client.close()
            stack.stop()  # before the folder is unmounted


# --- the rank log folder -------------------------------------------------------------------------

async def test_a_full_rank_log_folder_drops_output_with_a_marker_and_the_job_completes(
        make_stack: StackFactory, tmp_path: Path) -> None:
    """A rank printing while its log folder is full loses those lines, not its life: the stepd
    copies its output and drops what the disk refuses, saying how much once it can write again."""
    workers = tmp_path / "stack0" / "logs" / "workers"
    with tmpfs(workers, "1m"):
        stack = make_stack(cluster="1x8:H100")
        client = await connect(stack)
        try:
            await with_queues(client, QUEUES, nodes=1)
            chatty = await client.submit(job("chatty", 8.0))  # type: ignore[arg-type]
            log = workers / chatty / "rank-0.log"
            deadline = time.monotonic() + 60
            while b"step=2\n" not in (log.read_bytes() if log.exists() else b""):
                assert time.monotonic() < deadline, dump_logs(stack)
                await asyncio.sleep(0.1)
            filler = disk_faults.fill(workers)
            disk_faults.fill(log.parent, log.name, b"#")  # the rest of the log's last page: its next line finds no room
            await asyncio.sleep(1.5)  # ~15 lines printed into a full disk
            filler.unlink()
            view = await client.wait_for(lambda v: v.jobs[chatty].state.terminal, 60)
            text = log.read_text()
            assert view.jobs[chatty].state is JobState.COMPLETED, f"{view.jobs[chatty]}\n{text}"
            assert "bytes of output dropped: the log folder refused them (No space left on device)" in text, text
            assert text.rstrip().endswith("==== exited with code 0 ===="), text
        finally:
            await client.close()
            stack.stop()


# --- the NATS store -----------------------------------------------------------------------------

@contextlib.contextmanager
def supervised(stack: Stack) -> Iterator[Stack]:
    """`stack` started and supervised as `corral up` does (`Stack.supervise` every 0.25 s), then stopped."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(0.25):
            stack.supervise()

    stack.start()
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield stack
    finally:
        stop.set()
        thread.join(30)
        stack.stop()


async def test_a_nats_store_that_was_full_takes_submissions_again_without_a_restart(
        tmp_path: Path, postgres_dsn: str, namespace: str) -> None:
    """The NATS store is full: JetStream fails to store while its disk is full and stays wedged
    after space is back (its process alive). Once the file is removed, a new submission is placed
    within 30 s, with no restart of `corral up`."""
    data = tmp_path / "stack"
    store = data / "nats" / "jetstream"
    with tmpfs(store, "32m"), supervised(Stack(StackOptions(
            data_dir=data, cluster="1x8:H100", postgres_dsn=postgres_dsn, namespace=namespace, runtime="sim",
            placement_standby=False,
            extra_env={"CORRAL_NODE_LOST_SECONDS": "6", "CORRAL_AGENT_STOP_WORKERS_ON_EXIT": "1"}))) as stack:
        client = await connect(stack)
        try:
            await with_queues(client, QUEUES, nodes=1)
            first = await client.submit(job("before", 1.0))  # type: ignore[arg-type]
            await client.wait_for(lambda v: first in v.jobs and v.jobs[first].state is JobState.COMPLETED, 60)
            filler = disk_faults.fill(store)
            client.REQUEST_RETRY_SECONDS = 3.0  # type: ignore[misc]
            with contextlib.suppress(Exception):  # refused or unanswered while the store is full
                await client.submit(job("while-full", 1.0))  # type: ignore[arg-type]
            nats_log = data / "nats" / "nats.log"
            deadline = time.monotonic() + 30
            while b"no space left on device" not in nats_log.read_bytes():
                assert time.monotonic() < deadline, "nats-server never met the full disk"
                await asyncio.sleep(0.2)
            filler.unlink()
            freed = time.monotonic()
            client.REQUEST_RETRY_SECONDS = 30.0  # type: ignore[misc]
            after: str | None = None
            while after is None:
                with contextlib.suppress(Exception):
                    after = await client.submit(job("after", 1.0))  # type: ignore[arg-type]
                assert time.monotonic() - freed < 30, "the bus still refuses submissions 30 s after space is back"
            left = max(1.0, 30 - (time.monotonic() - freed))
            try:
                await client.wait_for(lambda v: after in v.jobs and v.jobs[after].state in (
                    JobState.RUNNING, JobState.COMPLETED), left)
            except TimeoutError:
                pytest.fail("a submission made after space was back was not placed within 30 s:\n"
                            + nats_log.read_text(errors="replace")[-3000:] + dump_logs(stack))
        finally:
            await client.close()


# --- node conditions ----------------------------------------------------------------------------

async def test_a_node_whose_disk_is_full_takes_no_new_work_until_its_condition_clears(
        make_stack: StackFactory, tmp_path: Path) -> None:
    """The agent reports DiskPressure on node-0 (its state folder full); placement puts nothing new
    there, `corral nodes` says why, and once space is back the condition clears by itself."""
    from corral.summary import node_rows

    run = tmp_path / "stack0" / "nodes" / "node-0" / "run"
    with tmpfs(run, "1m"):
        stack = make_stack(cluster="2x8:H100", env={"CORRAL_AGENT_CONDITIONS_SECONDS": "0.5"})
        client = await connect(stack)
        try:
            await with_queues(client, [{"name": "team-a", "guaranteed_gpus": 16, "max_gpus": 16}], nodes=2)
            filler = disk_faults.fill(run)
            await client.wait_for(lambda v: [c.type for c in v.nodes["node-0"].conditions] == ["DiskPressure"], 30)
            jobs = [await client.submit(job(f"whole-{i}", 120.0, gpus=8)) for i in range(2)]  # type: ignore[arg-type]
            view = await client.wait_for(lambda v: any(v.jobs[j].state is JobState.RUNNING for j in jobs
                                                       if j in v.jobs), 60)
            # placement has decided about the job that waits, with node-0 under pressure: it said why
            waiting = next(j for j in jobs if view.jobs[j].state is not JobState.RUNNING)
            deadline = time.monotonic() + 30
            while not any(e.type == "PlacementPending" for e in await client.store.read_stream(f"job-{waiting}")):
                assert time.monotonic() < deadline, dump_logs(stack)
                await asyncio.sleep(0.2)
            view = await client.view()
            placed = {j: {r.node for r in view.jobs[j].ranks} for j in jobs if view.jobs[j].ranks}
            assert list(placed.values()) == [{"node-1"}], placed
            row = next(r for r in node_rows(view) if r["node"] == "node-0")
            assert row["state"] == "pressure" and "has 0.0% free" in row["conditions"][0]["message"], row
            filler.unlink()
            view = await client.wait_for(lambda v: not v.nodes["node-0"].conditions and all(
                v.jobs[j].state is JobState.RUNNING for j in jobs), 60)
            assert {r.node for j in jobs for r in view.jobs[j].ranks} == {"node-0", "node-1"}
        finally:
            await client.close()
            stack.stop()


# --- the checkpoint folder ----------------------------------------------------------------------

async def test_a_checkpoint_the_full_disk_refuses_fails_and_the_preemption_falls_back_to_its_grace(
        make_stack: StackFactory, tmp_path: Path) -> None:
    """Asked to checkpoint while its checkpoint folder is full, the job is told (its write fails:
    it says so), no checkpoint is reported, the stop comes at the preemption's grace, and the job
    waits again and completes from the last checkpoint it could write."""
    checkpoints = tmp_path / "stack0" / "nodes" / "checkpoints"
    with tmpfs(checkpoints, "1m"):
        stack = make_stack(cluster="1x8:H100")
        client = await connect(stack)
        try:
            await with_queues(client, QUEUES, nodes=1)
            spec = validate_job_spec({"name": "ckpt", "queue": "team-a", "runtime": "sim", "duration_seconds": 6.0,
                                      "preemptible": True, "checkpoint": {"grace_seconds": 3},
                                      "env": {"CORRAL_SIM_ARGS": "--checkpoint-every 10"}})
            ckpt = await client.submit(spec)
            log = Path(stack.context.log_dir if stack.context else "") / "workers" / ckpt / "rank-0.log"
            deadline = time.monotonic() + 60
            while b"step=12\n" not in (log.read_bytes() if log.exists() else b""):  # its step-10 checkpoint is written
                assert time.monotonic() < deadline, dump_logs(stack)
                await asyncio.sleep(0.1)
            filler = disk_faults.fill(checkpoints)
            await client.requeue(ckpt, message="a checkpoint onto a full disk")
            await client.wait_for(lambda v: v.jobs[ckpt].attempt >= 1, 60)
            filler.unlink()
            view = await client.wait_for(lambda v: v.jobs[ckpt].state.terminal, 60)
            text = log.read_text()
            assert view.jobs[ckpt].state is JobState.COMPLETED, f"{view.jobs[ckpt]}\n{text}"
            assert "checkpoint failed at step=" in text and "No space left on device" in text, text
            assert "start step=10 " in text, text  # attempt 1 resumed from the checkpoint written before
        finally:
            await client.close()
            stack.stop()
