"""An OOM-kill is one more kill -9: a process of the stack put in a small memory cgroup is killed by
the kernel's OOM killer, `corral up`'s supervision restarts it (outside that cgroup), and every job
accepted before, during and after is still decided and ends COMPLETED; `corral audit verify` passes.

Skipped with the reason where no memory cgroup can be made (not root, no memory controller).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator

import pytest

from corral.client import Client
from corral.contracts.jobspec import validate_job_spec
from corral.projection import JobState
from corral.stack.up import Stack
from tests.e2e.conftest import Cluster, dump_logs
from tests.e2e.test_cli import corral
from tests.memory_cgroup import MemoryCgroup, why_not

pytestmark = pytest.mark.skipif(why_not() is not None, reason=why_not() or "")

#: Below what a service's fold grows by in a few bursts of submissions (each job it folds adds its
#: view and spec; pages already charged stay with the cgroup it came from).
LIMIT = 1 << 20


@contextlib.contextmanager
def supervising(stack: Stack) -> Iterator[None]:
    """`Stack.supervise` every 0.25 s, as `corral up` does."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(0.25):
            stack.supervise()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)


async def submit(client: Client, n: int, name: str) -> list[str]:
    spec = validate_job_spec({"name": name, "queue": "team-a", "runtime": "sim",
                              "duration_seconds": 0.2, "gpus_per_replica": 1})
    return list(await asyncio.gather(*(client.submit(spec) for _ in range(n))))


@pytest.mark.parametrize("victim", ["admission", "quota"])
async def test_an_oom_killed_process_is_restarted_and_nothing_accepted_is_lost(cluster: Cluster, victim: str,
                                                                             worker_id: str) -> None:
    stack, client = cluster.stack, cluster.client
    process = stack.process(victim)
    old_pid = process.pid
    assert old_pid is not None
    cgroup = MemoryCgroup.make(f"corral-oom-{victim}-{worker_id}-{old_pid}", LIMIT)
    try:
        with supervising(stack):
            jobs = await submit(client, 4, "before")
            cgroup.move(old_pid)
            deadline = time.monotonic() + 120
            # work makes it allocate: jobs keep coming until the kernel kills it
            while process.pid == old_pid and cgroup.oom_kills() == 0:
                assert time.monotonic() < deadline, f"{victim} was not OOM-killed:\n{dump_logs(stack)}"
                jobs += await submit(client, 20, "during")
                await asyncio.sleep(0.5)
            while process.pid == old_pid or not process.alive():
                assert time.monotonic() < deadline, f"{victim} was not restarted:\n{dump_logs(stack)}"
                await asyncio.sleep(0.25)
            assert cgroup.oom_kills() >= 1
            jobs += await submit(client, 4, "after")

            def all_completed(view: object) -> bool:
                got = getattr(view, "jobs", {})
                return all(j in got and got[j].state is JobState.COMPLETED for j in jobs)

            try:
                await client.wait_for(all_completed, 180)
            except TimeoutError:
                view = await client.view()
                states = {j: view.jobs[j].state.value if j in view.jobs else "missing" for j in jobs}
                raise AssertionError(f"not every accepted job completed: {states}\n{dump_logs(stack)}") from None
    finally:
        cgroup.remove()
    corral(stack, "audit", "verify")
