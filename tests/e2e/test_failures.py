"""Failures end to end: a crashed rank restarts the gang from its checkpoint; a silent node is lost;
a killed node agent's workers keep running and their exits are reported by the next agent."""

from __future__ import annotations

import signal

from corral.contracts import events as ev
from corral.contracts.jobspec import validate_job_spec
from corral.projection import JobState
from tests.e2e.conftest import Cluster, StackFactory, connect, dump_logs, with_queues
from tests.processes import alive, exited


def crashing(max_restarts: int, fail_on_attempt: int = 0) -> object:
    return validate_job_spec({
        "name": "crashy", "queue": "team-a", "replicas": 2, "gpus_per_replica": 4, "runtime": "sim",
        "duration_seconds": 3, "restart": {"max_restarts": max_restarts},
        "env": {"CORRAL_SIM_ARGS": f"--fail-at-step 10 --fail-rank 1 --fail-on-attempt {fail_on_attempt} "
                                   "--checkpoint-every 5"}})


async def test_a_crashed_rank_restarts_the_gang_from_its_checkpoint_then_completes(cluster: Cluster) -> None:
    c = cluster.client
    job = await c.submit(crashing(max_restarts=1))  # type: ignore[arg-type]
    view = await c.wait_for(lambda v: job in v.jobs and v.jobs[job].state.terminal, 90)
    assert view.jobs[job].state is JobState.COMPLETED, dump_logs(cluster.stack)
    trail = [e for _, e in await c.job_events(job)]
    released = [e for e in trail if isinstance(e, ev.GangReleased)]
    assert released[0].reason.code == "WORKER_FAILED" and "rank 1" in released[0].reason.message
    requeued = [e for e in trail if isinstance(e, ev.JobRequeued)]
    assert requeued and requeued[0].reason.code == "RESTARTING" and requeued[0].attempt == 1
    assert requeued[0].resume_from is not None, "the gang restarts from its last checkpoint"
    gangs = [e for e in trail if isinstance(e, ev.GangReserved)]
    assert [g.attempt for g in gangs] == [0, 1] and gangs[1].resume_from == requeued[0].resume_from


async def test_a_job_out_of_restarts_fails_with_the_reason(cluster: Cluster) -> None:
    c = cluster.client
    job = await c.submit(crashing(max_restarts=0))  # type: ignore[arg-type]
    view = await c.wait_for(lambda v: job in v.jobs and v.jobs[job].state.terminal, 90)
    assert view.jobs[job].state is JobState.FAILED
    failed = [e for _, e in await c.job_events(job) if isinstance(e, ev.JobFailed)]
    assert failed and failed[0].reason.code == "WORKER_FAILED" and "no restarts left" in failed[0].reason.message
    assert not view.jobs[job].holding


async def test_a_node_that_stops_heartbeating_is_lost_and_its_jobs_requeued(make_stack: StackFactory) -> None:
    stack = make_stack(cluster="2x8:H100")
    c = await connect(stack)
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 16}], nodes=2)
        job = await c.submit(validate_job_spec({"name": "long", "queue": "team-a", "gpus_per_replica": 8,
                                                "runtime": "sim", "duration_seconds": 600}))
        await c.wait_for(lambda v: job in v.jobs and v.jobs[job].state is JobState.RUNNING, 60)
        stack.process("node-agents").kill(signal.SIGKILL)  # every simulated node goes silent
        view = await c.wait_for(lambda v: all(n.lost for n in v.nodes.values()), 60)
        lost = [e for _, e in await c.events(types=["NodeLost"])]
        assert lost and lost[0].reason.code == "HEARTBEAT_MISSED"
        view = await c.wait_for(lambda v: v.jobs[job].state is JobState.PENDING, 30)
        # Requeued from its node; on a loaded machine the two nodes' limits can expire seconds apart,
        # and the job may have been placed on the other node and lost with it too: once per node.
        attempt = view.jobs[job].attempt
        assert not view.jobs[job].holding
        trail = [e for _, e in await c.job_events(job)]
        placed_on = [{r.node for r in e.ranks} for e in trail if isinstance(e, ev.GangReserved)]
        requeued = [e for e in trail if isinstance(e, ev.JobRequeued)]
        # every placement was ended by its node's loss, each on another node, and nothing else
        assert attempt == len(placed_on) == len(requeued) >= 1
        assert all(r.reason.code == "NODE_LOST" for r in requeued)
        assert len(set().union(*placed_on)) == len(placed_on)
        stack.process("node-agents").start()  # the nodes come back and register again
        await c.wait_for(lambda v: v.jobs[job].state is JobState.RUNNING and v.jobs[job].attempt == attempt, 60)
    except BaseException:
        print(dump_logs(stack))
        raise
    finally:
        await c.close()


async def test_a_rank_that_ends_while_the_node_agents_are_killed_completes_its_job(make_stack: StackFactory) -> None:
    # The exit happens while no agent runs, so no agent reports it live; the restarted agent must,
    # or the job stays RUNNING forever. The node is not declared lost (the agents are back well
    # within 60 s).
    stack = make_stack(cluster="1x8:H100", env={"CORRAL_NODE_LOST_SECONDS": "60"})
    c = await connect(stack)
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 8}], nodes=1)
        job = await c.submit(validate_job_spec({"name": "short", "queue": "team-a", "gpus_per_replica": 2,
                                                "runtime": "sim", "duration_seconds": 3}))
        await c.wait_for(lambda v: job in v.jobs and v.jobs[job].state is JobState.RUNNING, 60)
        [started] = [e for _, e in await c.job_events(job) if isinstance(e, ev.WorkerStarted)]
        stack.process("node-agents").kill(signal.SIGKILL)
        assert alive(started.pid), "the worker outlives its agent"
        await exited([started.pid])  # the rank finishes its 3 s of work while no agent runs
        assert (await c.view()).jobs[job].state is JobState.RUNNING
        stack.process("node-agents").start()
        view = await c.wait_for(lambda v: v.jobs[job].state.terminal, 60)
        assert view.jobs[job].state is JobState.COMPLETED and view.jobs[job].attempt == 0
        exits = [e for _, e in await c.job_events(job) if isinstance(e, ev.WorkerExited)]
        assert [(e.rank, e.exit_code) for e in exits] == [(0, 0)]
    except BaseException:
        print(dump_logs(stack))
        raise
    finally:
        await c.close()
