"""examples/ddp_allreduce.py run by two node-agent supervisors (2 nodes x 2 ranks, gloo on CPU):
it is preempted mid-run, writes a real checkpoint, and the relaunch continues its step counter."""

from __future__ import annotations

import asyncio
import re
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from corral.services.node_agent.assignment import Assignment, RankAssignment
from corral.services.node_agent.supervisor import GangEnd, GangOutcome, Supervisor
from corral.worker import CHECKPOINTED_EXIT_CODE

torch = pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_allreduce.py"
STEPS = 40


class Quiet:
    """AgentEvents that ignores everything: outcomes are read from the supervisor here."""

    async def worker_started(self, *args: Any, **meta: Any) -> None: ...
    async def worker_exited(self, *args: Any, **meta: Any) -> None: ...
    async def checkpoint_done(self, *args: Any, **meta: Any) -> None: ...
    async def gang_ended(self, outcome: GangOutcome) -> None: ...


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def wait_for(condition: Callable[[], bool], timeout: float) -> None:
    async def loop() -> None:
        while not condition():
            await asyncio.sleep(0.05)
    await asyncio.wait_for(loop(), timeout)


def node_assignments(tmp_path: Path, attempt: int, resume_from: Path | None) -> list[Assignment]:
    port = free_port()
    return [
        Assignment(job_id="ddp", attempt=attempt, world_size=4, node_rank=node, group_world_size=2,
                   master_addr="127.0.0.1", master_port=port,
                   ranks=(RankAssignment(2 * node, 0), RankAssignment(2 * node + 1, 1)),
                   command=(sys.executable, str(EXAMPLE), "--steps", str(STEPS), "--step-seconds", "0.05"),
                   checkpoint_dir=tmp_path / "ckpt", log_dir=tmp_path / "logs", resume_from=resume_from,
                   env={"OMP_NUM_THREADS": "1"})
        for node in (0, 1)
    ]


def steps_in(text: str) -> list[int]:
    return [int(m) for m in re.findall(r"^rank \d+ step (\d+) ", text, re.MULTILINE)]


async def test_ddp_job_is_preempted_checkpoints_and_resumes_where_it_stopped(tmp_path: Path) -> None:
    nodes = [Supervisor(Quiet(), tmp_path / f"run-node{n}", kill_grace=5) for n in (0, 1)]
    first = node_assignments(tmp_path, attempt=1, resume_from=None)
    for sup, a in zip(nodes, first, strict=True):
        assert (await sup.start(a)).ok
    logs = [tmp_path / "logs" / "ddp" / f"rank-{r}.log" for r in range(4)]
    await wait_for(lambda: all(p.exists() and max(steps_in(p.read_text()), default=0) >= 5 for p in logs), 60)

    node0, node1 = await asyncio.gather(*(sup.preempt("ddp", grace_seconds=20) for sup in nodes))
    assert node0 is not None and node1 is not None
    assert node0.end is node1.end is GangEnd.PREEMPTED
    assert set(node0.exits.values()) == set(node1.exits.values()) == {CHECKPOINTED_EXIT_CODE}
    assert node0.checkpoint is not None and node0.checkpoint.rank == 0
    assert node1.checkpoint is None  # only rank 0 (on node 0) writes the checkpoint
    saved_step = node0.checkpoint.step
    assert 5 <= saved_step < STEPS
    state = torch.load(node0.checkpoint.path, weights_only=True)
    assert state["step"] == saved_step and "weight" in state["model"]
    first_attempt = logs[0].read_text()
    assert max(steps_in(first_attempt)) == saved_step  # every rank stopped at the agreed step

    again = node_assignments(tmp_path, attempt=2, resume_from=node0.checkpoint.path)
    for sup, a in zip(nodes, again, strict=True):
        assert (await sup.start(a)).ok
    outcomes = await asyncio.wait_for(asyncio.gather(*(sup.wait("ddp") for sup in nodes)), 90)
    for outcome in outcomes:
        assert outcome is not None and outcome.end is GangEnd.COMPLETED, outcome
    for path in logs:
        text = path.read_text()
        second = text[text.index("attempt 2 rank"):]
        assert f"resumed from {node0.checkpoint.path} at step {saved_step}" in second
        assert steps_in(second) == list(range(saved_step + 1, STEPS + 1))  # continues, not restarts
        assert f"done at step {STEPS}" in second
    losses = [float(x) for x in re.findall(r"^rank 0 step \d+ loss ([\d.]+)", logs[0].read_text(), re.M)]
    assert losses[saved_step] < losses[0]  # the model state came back too, not just the counter
