"""The brief's cases end to end: all services and node agents as processes, real NATS and Postgres.

Every wait is on an event-log condition with a timeout; nothing sleeps for a fixed time.
"""

from __future__ import annotations

import json
import re
import signal
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from corral.client import Client
from corral.contracts import events as ev
from corral.contracts.jobspec import JobSpec, validate_job_spec
from corral.projection import ClusterView, JobState
from corral.worker import CHECKPOINTED_EXIT_CODE
from tests.e2e.conftest import Cluster, StackFactory, connect, dump_logs, with_queues

ROOT = Path(__file__).resolve().parents[2]


def sim(queue: str, replicas: int, gpus: int, seconds: float, **extra: Any) -> JobSpec:
    return validate_job_spec({"name": f"{queue}-{replicas}x{gpus}", "queue": queue, "replicas": replicas,
                              "gpus_per_replica": gpus, "runtime": "sim", "duration_seconds": seconds, **extra})


def state(view: ClusterView, job: str) -> JobState | None:
    j = view.jobs.get(job)
    return j.state if j is not None else None


def holdings_over_time(events: Iterable[tuple[Any, Any]]) -> tuple[dict[str, int], list[str]]:
    """Replay the log: the most GPUs each queue ever held, and any GPU ever held by two jobs."""
    view = ClusterView()
    peak: dict[str, int] = {}
    doubles: list[str] = []
    holder: dict[tuple[str, int], str] = {}
    for stored, event in events:
        if isinstance(event, ev.GpusAllocated):
            for g in event.gpus:
                if (event.node, g) in holder:
                    doubles.append(f"{event.node}/{g}: {holder[(event.node, g)]} and {event.job_id}")
                holder[(event.node, g)] = event.job_id
        elif isinstance(event, ev.GpusReleased):
            for g in event.gpus:
                if holder.get((event.node, g)) == event.job_id:
                    del holder[(event.node, g)]
        view.apply(event, stored.version, stored.position)
        held: dict[str, int] = {}
        for j in view.running_jobs():
            held[j.queue] = held.get(j.queue, 0) + j.gpus
        for q, n in held.items():
            peak[q] = max(peak.get(q, 0), n)
    return peak, doubles


async def test_fair_share_team_b_gets_its_guarantee_back_by_reclaim(make_stack: StackFactory) -> None:
    stack = make_stack()
    c = await connect(stack)
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 16, "max_gpus": 24},
                              {"name": "team-b", "guaranteed_gpus": 16, "max_gpus": 32}], nodes=4)
        a_jobs = [await c.submit(sim("team-a", 1, 8, 120, checkpoint={"grace_seconds": 5}, name=f"a{i}"))
                  for i in range(4)]
        # Team A borrows up to its max (24 of 32): three jobs run, the fourth waits on max_gpus.
        await c.wait_for(lambda v: sum(state(v, j) is JobState.RUNNING for j in a_jobs) == 3, 60)
        b_job = await c.submit(sim("team-b", 2, 8, 10, name="b"))
        view = await c.wait_for(lambda v: state(v, b_job) is JobState.RUNNING, 90)
        preempted = [j for j in a_jobs if view.jobs[j].preempted_by]
        assert preempted, "team B's guarantee was borrowed by team A: a reclaim must have happened"
        assert all(view.jobs[j].reason is None or view.jobs[j].reason.code for j in a_jobs)
        peak, doubles = holdings_over_time(await c.events())
        assert peak.get("team-a", 0) <= 24 and peak.get("team-b", 0) <= 32, peak
        assert doubles == []
    except BaseException:
        print(dump_logs(stack))
        raise
    finally:
        await c.close()


async def test_gang_waits_with_30_free_and_starts_all_32_ranks_together(cluster: Cluster) -> None:
    c = cluster.client
    blocker = await c.submit(sim("team-b", 1, 2, 600))
    await c.wait_for(lambda v: state(v, blocker) is JobState.RUNNING, 60)
    gang = await c.submit(sim("team-a", 4, 8, 10))
    view = await c.wait_for(lambda v: v.jobs.get(gang) is not None and v.jobs[gang].reason is not None
                            and v.jobs[gang].reason.code == "GANG_DOES_NOT_FIT", 60)
    assert not view.jobs[gang].holding
    assert all(j != gang for n in view.nodes.values() for j in n.allocations.values())
    await c.cancel(blocker)
    await c.wait_for(lambda v: state(v, gang) in (JobState.RUNNING, JobState.COMPLETED), 60)
    starts = [(s.occurred_at, e) for s, e in await c.job_events(gang) if isinstance(e, ev.WorkerStarted)]
    assert len(starts) == 4
    window = (max(t for t, _ in starts) - min(t for t, _ in starts)).total_seconds()
    assert window < 5.0, f"all ranks start inside one barrier window, took {window:.2f}s"
    running = [e for _, e in await c.job_events(gang) if isinstance(e, ev.JobRunning)]
    assert len(running) == 1


async def test_urgent_job_preempts_low_priority_which_checkpoints_and_resumes(cluster: Cluster) -> None:
    c = cluster.client
    # 15 s of work: preempted ~2 s after it runs (5 s under a loaded 2-core machine), then resumed to the end.
    low = await c.submit(sim("team-a", 4, 8, 15, priority="low", checkpoint={"grace_seconds": 10}))
    await c.wait_for(lambda v: state(v, low) is JobState.RUNNING, 60)
    urgent = await c.submit(sim("team-a", 2, 8, 5, priority="urgent", preemptible=False))
    view = await c.wait_for(lambda v: state(v, urgent) in (JobState.RUNNING, JobState.COMPLETED), 90)
    low_view = view.jobs[low]
    assert urgent in low_view.preempted_by
    trail = [e for _, e in await c.job_events(low)]
    checkpoints = [e for e in trail if isinstance(e, ev.CheckpointDone)]
    assert checkpoints and Path(checkpoints[0].path).exists(), "a real checkpoint file was written"
    requeued = [e for e in trail if isinstance(e, ev.JobRequeued)]
    assert requeued and requeued[0].resume_from == checkpoints[0].path
    # The urgent job got GPUs the low-priority job released.
    freed = {(r.node, g) for e in trail if isinstance(e, ev.GangReserved) for r in e.ranks for g in r.gpus}
    urgent_gpus = {(r.node, g) for _, e in await c.job_events(urgent) if isinstance(e, ev.GangReserved)
                   for r in e.ranks for g in r.gpus}
    assert urgent_gpus <= freed
    # The low-priority job runs again from its checkpoint: its step counter continues.
    view = await c.wait_for(lambda v: state(v, low) is JobState.COMPLETED, 120)
    log = (Path(cluster.stack.context.log_dir) / "workers" / low / "rank-0.log")  # type: ignore[union-attr]
    text = log.read_text()
    saved = int(re.findall(r"checkpointed step=(\d+)", text)[0])
    starts = [(int(a), int(s)) for a, s in re.findall(r"attempt=(\d+) start step=(\d+)", text)]
    resumed = [step for attempt, step in starts if attempt > starts[0][0]]
    assert resumed and resumed[0] == saved and saved > 0, starts


async def test_nvlink_gang_lands_on_the_one_whole_nvlink_node(make_stack: StackFactory, tmp_path: Path) -> None:
    cluster_file = tmp_path / "cluster.json"
    cluster_file.write_text(json.dumps({"nodes": [
        {"name": "pairs", "gpus": 8, "model": "H100", "nvlink_domains": [[0, 1], [2, 3], [4, 5], [6, 7]],
         "rack": "r0"},
        {"name": "busy", "gpus": 8, "model": "H100", "rack": "r0"},
        {"name": "whole", "gpus": 8, "model": "H100", "rack": "r1"},
        {"name": "spare", "gpus": 8, "model": "H100", "rack": "r1"},
    ]}))
    stack = make_stack(cluster=None, cluster_file=cluster_file)
    c = await connect(stack)
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 16}, {"name": "team-b", "guaranteed_gpus": 16}],
                          nodes=4)
        # Fragment: one job takes 4 GPUs of `busy`, another 6 of `spare`.
        f1 = await c.submit(sim("team-a", 1, 4, 600, topology={"replica": "node"}))
        await c.wait_for(lambda v: state(v, f1) is JobState.RUNNING, 60)
        f2 = await c.submit(sim("team-a", 1, 6, 600))
        view = await c.wait_for(lambda v: state(v, f2) is JobState.RUNNING, 60)
        used = {n for j in (f1, f2) for n in view.jobs[j].nodes}
        job = await c.submit(sim("team-b", 8, 1, 10, topology={"replica": "nvlink", "gang": "nvlink"}))
        view = await c.wait_for(lambda v: state(v, job) in (JobState.RUNNING, JobState.COMPLETED), 60)
        nodes = view.jobs[job].nodes
        assert len(nodes) == 1 and nodes[0] not in used and nodes[0] != "pairs", (nodes, used)
        assert view.free_gpus() >= 8, "more free GPUs existed elsewhere, fragmented or in NVLink pairs"
    finally:
        await c.close()


def ddp_steps(text: str) -> list[int]:
    return [int(m) for m in re.findall(r"^rank \d+ step (\d+) ", text, re.MULTILINE)]


@pytest.mark.skipif(not any(Path(p, "torch").exists() for p in sys.path), reason="torch is not installed")
async def test_real_ddp_allreduce_job_completes_through_corral_after_a_preemption(make_stack: StackFactory) -> None:
    """examples/ddp_allreduce.py, 2 nodes x 2 ranks on gloo, through Corral: preempted mid-run, every
    rank stops at the step they agreed on, only rank 0 writes the checkpoint, every rank exits with
    the checkpointed code, and the relaunch continues the step counter and the model on every rank.
    It also holds the assertions of the former supervisor-level DDP test (tests/integration), which
    ran the same job on two bare supervisors: one torch job in the suite instead of two, as starting
    torch in four ranks, twice, is most of either test's time."""
    steps = 60
    stack = make_stack(cluster="2x2:CPU", runtime="process")
    c = await connect(stack)
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 4}], nodes=2)
        ddp = await c.submit(validate_job_spec({
            "name": "ddp", "queue": "team-a", "replicas": 4, "gpus_per_replica": 1, "priority": "low",
            "checkpoint": {"grace_seconds": 30}, "runtime": "process", "env": {"OMP_NUM_THREADS": "1"},
            "command": [sys.executable, str(ROOT / "examples" / "ddp_allreduce.py"), "--steps", str(steps),
                        "--step-seconds", "0.15"]}))
        view = await c.wait_for(lambda v: state(v, ddp) is JobState.RUNNING, 90)
        assert len(view.jobs[ddp].nodes) == 2, "2 nodes x 2 ranks"
        logs = [Path(stack.context.log_dir) / "workers" / ddp / f"rank-{r}.log" for r in range(4)]
        await c.wait_for(lambda v: logs[0].exists() and "step 10 " in logs[0].read_text(), 90)
        urgent = await c.submit(sim("team-a", 2, 2, 3, priority="urgent", preemptible=False))
        await c.wait_for(lambda v: state(v, urgent) in (JobState.RUNNING, JobState.COMPLETED), 90)
        view = await c.wait_for(lambda v: state(v, ddp) is JobState.COMPLETED, 180)
        trail = [e for _, e in await c.job_events(ddp)]

        checkpoints = [e for e in trail if isinstance(e, ev.CheckpointDone)]
        assert len(checkpoints) == 1 and checkpoints[0].rank == 0, checkpoints  # rank 0 alone writes it
        saved, first = checkpoints[0].step, checkpoints[0].attempt
        assert saved is not None and 10 <= saved < steps, saved
        assert Path(checkpoints[0].path).is_file(), "a real checkpoint file"
        stopped = {e.rank: e.exit_code for e in trail if isinstance(e, ev.WorkerExited) and e.attempt == first}
        assert stopped == dict.fromkeys(range(4), CHECKPOINTED_EXIT_CODE), stopped
        requeued = [e for e in trail if isinstance(e, ev.JobRequeued)]
        assert len(requeued) == 1 and requeued[0].resume_from == checkpoints[0].path, requeued
        for rank, path in enumerate(logs):
            text = path.read_text()
            header = f"==== corral job {ddp} attempt {requeued[0].attempt} rank {rank} "
            before, after = text[:text.index(header)], text[text.index(header):]
            assert max(ddp_steps(before)) == saved, rank  # every rank stopped at the agreed step
            assert f"rank {rank} resumed from {checkpoints[0].path} at step {saved}" in after
            assert ddp_steps(after) == list(range(saved + 1, steps + 1)), rank  # continues, not restarts
            assert f"rank {rank} done at step {steps}" in after
        losses = [float(x) for x in re.findall(r"^rank 0 step \d+ loss ([\d.]+)", logs[0].read_text(), re.M)]
        assert losses[saved] < losses[0]  # the model came back too, not just the counter
    except BaseException:
        print(dump_logs(stack))
        raise
    finally:
        await c.close()


async def test_killing_placement_mid_burst_never_double_books_and_loses_no_job(make_stack: StackFactory) -> None:
    """kill -9 of placement during a burst of 200 submissions: the standby (or the restarted one) takes
    over, no GPU is ever held twice (in the log and in the allocations table), every job is running,
    done or pending with a reason. The agents run `sim-timer` (a timer per gang, no process per rank):
    what is proven here is placement's single writer, and 300 rank processes would only measure
    Python's start-up (processes and their GPUs under faults: tests/chaos)."""
    stack = make_stack(cluster="8x8:H100", runtime="sim-timer")
    c = await connect(stack)
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 32}, {"name": "team-b", "guaranteed_gpus": 32}],
                          nodes=8)
        jobs = []
        for i in range(200):
            queue = "team-a" if i % 2 else "team-b"
            jobs.append(await c.submit(sim(queue, 1 + i % 2, 1 + i % 4, 1 + i % 3, name=f"burst{i}")))
            if i == 60:
                await c.wait_for(lambda v: any(j.holding for j in v.jobs.values()), 30)
                stack.process("placement").kill(signal.SIGKILL)
        settled = {JobState.RUNNING, JobState.STARTING, JobState.COMPLETED, JobState.PENDING}

        def all_accounted(v: ClusterView) -> bool:
            return all(j in v.jobs and v.jobs[j].state in settled and
                       (v.jobs[j].state is not JobState.PENDING or v.jobs[j].reason is not None) for j in jobs)

        await c.wait_for(all_accounted, 120)
        await c.wait_for(lambda v: sum(v.jobs[j].state is JobState.COMPLETED for j in jobs) >= 150, 240)
        _, doubles = holdings_over_time(await c.events())
        assert doubles == [], doubles[:5]
        import asyncpg

        conn = await asyncpg.connect(stack.context.postgres_dsn)  # type: ignore[union-attr]
        try:
            open_twice = await conn.fetchval(
                "SELECT count(*) FROM (SELECT node, gpu FROM allocations WHERE released_by IS NULL "
                "GROUP BY node, gpu HAVING count(*) > 1) x")
        finally:
            await conn.close()
        assert open_twice == 0
    except BaseException:
        print(dump_logs(stack))
        raise
    finally:
        await c.close()


__all__ = ["Client"]
