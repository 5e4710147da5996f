"""A job waiting longer than its queue's `max_wait` gets one WaitExceeded with its
blocker; `corral jobs --stuck` lists it, `corral why` shows the step, quota's metric counts it, and
a quota killed (-9) and restarted re-derives from the log that this wait was escalated already.

One stack (4 nodes x 8 GPUs): queue `ops` (ceiling 8 GPUs, max_wait 2s) gets a 2x8 gang that
cannot fit under its ceiling; after ~2 s it is escalated once, and stays escalated once.
"""

from __future__ import annotations

import asyncio
import signal
import time

from corral.contracts import events as ev
from corral.contracts.jobspec import validate_job_spec
from corral.projection import JobState
from tests.e2e.conftest import Cluster, dump_logs, with_queues
from tests.e2e.test_cli import as_json, corral
from tests.metrics_text import readyz, scrape


def spec(queue: str, replicas: int, seconds: float) -> object:
    return validate_job_spec({"name": f"{queue}-job", "queue": queue, "replicas": replicas, "gpus_per_replica": 8,
                              "runtime": "sim", "duration_seconds": seconds})


def ready(url: str) -> bool:
    try:
        return readyz(url)[0] == 200
    except OSError:  # not listening yet
        return False


async def escalations(cluster: Cluster, job: str) -> list[ev.WaitExceeded]:
    return [e for _, e in await cluster.client.job_events(job) if isinstance(e, ev.WaitExceeded)]


async def test_a_job_past_max_wait_is_escalated_once_listed_and_explained(cluster: Cluster) -> None:
    stack, c = cluster.stack, cluster.client
    await with_queues(c, [{"name": "ops", "max_gpus": 8, "max_wait": "2s"}], nodes=4)
    assert (await c.view()).queues["ops"].max_wait == 2.0

    stuck = await c.submit(spec("ops", 2, 5))  # 16 GPUs under a ceiling of 8: waits for good
    view = await c.wait_for(lambda v: stuck in v.jobs and v.jobs[stuck].wait_exceeded is not None, 20)
    job = view.jobs[stuck]
    assert job.state is JobState.PENDING and job.waiting_since is not None
    exceeded = job.wait_exceeded
    assert exceeded is not None and exceeded.actor == "quota" and exceeded.attempt == 0
    assert exceeded.max_wait_seconds == 2.0 and exceeded.limit_queue == "ops"
    assert exceeded.waited_seconds > 2.0 and exceeded.waiting_since == job.waiting_since
    assert exceeded.blocker is not None and exceeded.blocker.code == "MAX_GPUS_EXCEEDED", exceeded

    rows = as_json(corral(stack, "jobs", "--stuck", "--json"))
    assert [r["id"] for r in rows] == [stuck], rows
    assert rows[0]["blocker_code"] == "MAX_GPUS_EXCEEDED" and rows[0]["past_seconds"] > 0
    assert rows[0]["max_wait_seconds"] == 2.0 and rows[0]["escalated_at"] == exceeded.occurred_at.isoformat()

    why = as_json(corral(stack, "why", stuck, "--json"))
    (step,) = [s for s in why["trail"] if s["event"] == "WaitExceeded"]
    assert step["actor"] == "quota" and "past max_wait 2s of queue ops" in step["message"]
    assert "MAX_GPUS_EXCEEDED" in step["message"] and step["details"]["blocker"]["code"] == "MAX_GPUS_EXCEEDED"
    assert why["blocker"]["wait_exceeded"]["max_wait_seconds"] == 2.0
    assert "Escalated" in corral(stack, "why", stuck).stdout

    # quota killed and restarted: the log says this wait was escalated; no second event
    assert stack.context is not None
    quota_url = stack.context.metrics["quota"]
    stack.process("quota").kill(signal.SIGKILL)
    stack.process("quota").start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not await asyncio.to_thread(ready, quota_url):
        await asyncio.sleep(0.3)
    assert ready(quota_url), dump_logs(stack)
    other = await c.submit(spec("team-a", 1, 0.5))  # quota reserves for it: it reconciles again
    await c.wait_for(lambda v: other in v.jobs and v.jobs[other].state is JobState.COMPLETED, 30)
    assert len(await escalations(cluster, stuck)) == 1
    assert scrape(quota_url).values("corral_jobs_wait_exceeded", queue="ops") == [1.0]
    corral(stack, "audit", "verify")
