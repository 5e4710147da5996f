"""A GPU is free only when its processes are gone (never two jobs' processes on the same GPU).

Rank 0 of a 2-rank gang crashes; rank 1 ignores SIGTERM for a few seconds. Placement ends the gang
at once (GangReleased, the job fails), but the node's GPUs stay allocated to it until rank 1's
WorkerExited is recorded: a job waiting for those GPUs is placed only after that.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from corral.contracts import events as ev
from corral.contracts.jobspec import validate_job_spec
from corral.projection import JobState
from tests.e2e.conftest import StackFactory, connect, dump_logs, with_queues

# rank 0 crashes after 1.5 s; rank 1 keeps running for 3 s after its SIGTERM, then exits
SLOW_TO_STOP = """
import os, signal, sys, time
if os.environ["RANK"] == "0":
    time.sleep(1.5)
    sys.exit(3)
stop_at = []
signal.signal(signal.SIGTERM, lambda *_: stop_at.append(time.monotonic() + 3.0))
while not stop_at or time.monotonic() < stop_at[0]:
    time.sleep(0.05)
sys.exit(0)
"""


async def test_gpus_of_a_crashed_gang_are_placed_again_only_after_every_rank_exited(
        make_stack: StackFactory) -> None:
    stack = make_stack(cluster="1x8:H100", runtime="process")
    c = await connect(stack)
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 8}], nodes=1)
        crashing = await c.submit(validate_job_spec({
            "name": "slow-to-stop", "queue": "team-a", "replicas": 2, "gpus_per_replica": 4,
            "runtime": "process", "command": [sys.executable, "-c", SLOW_TO_STOP],
            "restart": {"max_restarts": 0}}))
        await c.wait_for(lambda v: crashing in v.jobs and v.jobs[crashing].state is JobState.RUNNING, 60)
        waiting = await c.submit(validate_job_spec({
            "name": "next", "queue": "team-a", "gpus_per_replica": 8, "runtime": "sim",
            "duration_seconds": 1}))
        await c.wait_for(lambda v: waiting in v.jobs and v.jobs[waiting].state.terminal, 90)
        for _ in range(150):  # rank 1 ends 3 s after its SIGTERM
            trail = await c.job_events(crashing)
            if len([e for _, e in trail if isinstance(e, ev.WorkerExited)]) == 2:
                break
            await asyncio.sleep(0.2)
        exits = {e.rank: stored.position for stored, e in trail if isinstance(e, ev.WorkerExited)}
        released = [stored.position for stored, e in trail if isinstance(e, ev.GangReleased)]
        assert sorted(exits) == [0, 1], dump_logs(stack)
        assert released and released[0] < exits[1], "the gang ends at once, not when its last rank stops"
        reserved = [stored.position for stored, e in await c.job_events(waiting) if isinstance(e, ev.GangReserved)]
        assert reserved and reserved[0] > exits[1], (
            f"job {waiting} was placed (position {reserved[0]}) on GPUs whose rank 1 of {crashing} was still "
            f"running (its WorkerExited is at {exits[1]})")
        freed = [(stored.position, e) for stored, e in await c.events(types=["GpusReleased"])
                 if e.job_id == crashing]
        assert freed and all(position > exits[1] for position, _ in freed)
        assert sorted(g for _, e in freed for g in e.gpus) == list(range(8))
    except BaseException:
        print(dump_logs(stack))
        raise
    finally:
        await c.close()


# runs until its SIGTERM, then takes 3 s to stop
STOPS_IN_3S = """
import signal, sys, time
stop_at = []
signal.signal(signal.SIGTERM, lambda *_: stop_at.append(time.monotonic() + 3.0))
while not stop_at or time.monotonic() < stop_at[0]:
    time.sleep(0.05)
sys.exit(0)
"""


async def test_a_lost_node_that_comes_back_gets_no_new_gang_until_the_old_ranks_are_gone(
        make_stack: StackFactory) -> None:
    """The 20-minute chaos run's double use: the node agent stalls (SIGSTOP) past the node-lost
    limit; placement declares the node lost and requeues its gang (NODE_LOST). Freeing the node's
    GPUs at that moment was wrong: when the agent runs again it registers the node, the requeued
    job is placed there at once, and the old ranks are still stopping. The GPUs must stay held
    until the node's own word (an exit, or heartbeats no longer listing the job) says they are gone."""
    stack = make_stack(cluster="1x8:H100", runtime="process")
    c = await connect(stack)
    agents = stack.process("node-agents")
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 8}], nodes=1)
        job = await c.submit(validate_job_spec({
            "name": "outlives-its-node", "queue": "team-a", "gpus_per_replica": 8,
            "runtime": "process", "command": [sys.executable, "-c", STOPS_IN_3S]}))
        await c.wait_for(lambda v: job in v.jobs and v.jobs[job].state is JobState.RUNNING, 60)
        agents.kill(signal.SIGSTOP)
        try:
            await c.wait_for(lambda v: v.jobs[job].attempt == 1, 60)  # lost (6 s) and requeued
        finally:
            agents.kill(signal.SIGCONT)
        await c.wait_for(lambda v: v.jobs[job].state is JobState.RUNNING and v.jobs[job].attempt == 1, 60)
        trail = await c.job_events(job)
        exited = [stored.position for stored, e in trail if isinstance(e, ev.WorkerExited) and e.attempt == 0]
        again = [stored.position for stored, e in trail if isinstance(e, ev.GangReserved) and e.attempt == 1]
        assert exited and again, dump_logs(stack)
        assert again[0] > exited[0], (
            f"attempt 1 of {job} was placed (position {again[0]}) on the GPUs of attempt 0, whose rank was "
            f"still stopping (its WorkerExited is at {exited[0]})")
        freed = [stored.position for stored, e in await c.events(types=["GpusReleased"])
                 if e.job_id == job and e.attempt == 0]
        assert freed and freed[0] > exited[0]
    except BaseException:
        print(dump_logs(stack))
        raise
    finally:
        agents.kill(signal.SIGCONT)
        await c.close()
