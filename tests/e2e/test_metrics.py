"""Each process's /metrics against the commands, on one stack after a small workload.

The workload: a low-priority 4x8 gang of team-a runs, an urgent 2x8 gang of team-a preempts it
(checkpoint, requeue: it waits again, a pending gang), and a 4x8 gang of team-b waits too. Then
every family of `OWNED` is on the owning process's page; an idle node is drained and the
team-b gang held (`corral drain`, `corral hold`), and the gauges have the values `corral jobs`,
`corral queues` and `corral nodes` print at that moment (GPUs `draining`, reason `HELD`); the
counters equal what the log says.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from corral.client import Client
from corral.contracts import events as ev
from corral.projection import JobState
from corral.stack.up import Stack
from tests.e2e.conftest import StackFactory, connect, dump_logs, with_queues
from tests.e2e.test_cli import as_json, corral
from tests.e2e.test_cluster_cases import sim, state
from tests.metrics_text import Page, readyz, scrape

#: The metric families each process must report, by the process that reports them.
OWNED = {
    "admission": ["corral_admission_attempts_total"],
    "quota": ["corral_pending_jobs", "corral_quota_reservations_total", "corral_job_wait_to_quota_seconds",
              "corral_queue_used_gpus", "corral_queue_guaranteed_gpus", "corral_queue_fair_share_gpus"],
    "placement": ["corral_job_wait_to_placement_seconds", "corral_job_wait_to_running_seconds", "corral_gpus",
                  "corral_gpu_allocation_ratio", "corral_job_requeues_total", "corral_job_failures_total",
                  "corral_lost_gpu_seconds_total", "corral_node_heartbeat_age_seconds", "corral_jobs"],
    "preemption": ["corral_preemptions_total"],
}
EVERY_SERVICE = ["corral_scheduling_cycle_duration_seconds", "corral_scheduling_cycle_decisions",
                 "corral_eventstore_append_duration_seconds", "corral_relay_lag_seconds", "corral_relay_lag_events",
                 "corral_consumer_pending_messages", "corral_dlq_messages"]


async def eventually(check: Callable[[], Any], timeout: float = 15.0) -> Any:
    """`check()` once it stops raising AssertionError (the services fold the log a moment after it
    is written; the commands read it at once)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await asyncio.to_thread(check)
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def test_every_family_is_scraped_with_the_values_the_commands_print(make_stack: StackFactory) -> None:
    stack = make_stack(env={"CORRAL_LOG_FORMAT": "json"})
    c = await connect(stack)
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 16, "max_gpus": 32},
                              {"name": "team-b", "guaranteed_gpus": 16, "max_gpus": 32}], nodes=4)
        await workload_then_scrape(stack, c)
    finally:
        await c.close()


async def workload_then_scrape(stack: Stack, c: Client) -> None:
    assert stack.context is not None and stack.context.metrics
    urls = stack.context.metrics
    assert set(urls) >= {"admission", "quota", "placement", "placement-standby", "preemption",
                                  "node-agents"}, urls
    low = await c.submit(sim("team-a", 4, 8, 120, priority="low", checkpoint={"grace_seconds": 5}))
    await c.wait_for(lambda v: state(v, low) is JobState.RUNNING, 60)
    urgent = await c.submit(sim("team-a", 2, 8, 120, priority="urgent", preemptible=False))
    big = await c.submit(sim("team-b", 4, 8, 60))
    view = await c.wait_for(lambda v: state(v, urgent) is JobState.RUNNING and state(v, low) is JobState.PENDING
                            and state(v, big) is JobState.PENDING and not v.releasing_gpus()
                            and all(v.jobs[j].reason is not None for j in (low, big)), 90)
    assert urgent in view.jobs[low].preempted_by, dump_logs(stack)
    log = [e for _, e in await c.events()]

    # Either placement process may hold the lease (they start together): "placement" is the holder.
    def lease_holder() -> str:
        held = [n for n in ("placement", "placement-standby") if readyz(urls[n])[0] == 200]
        assert len(held) == 1, held
        return held[0]

    holder = await eventually(lease_holder)
    urls = {**urls, "placement": urls[holder],
            "placement-standby": urls["placement-standby" if holder == "placement" else "placement"]}

    def pages() -> dict[str, Page]:
        return {name: scrape(url) for name, url in urls.items()}

    def families_and_health() -> dict[str, Page]:
        got = pages()
        for name, families in OWNED.items():
            missing = [f for f in [*families, *EVERY_SERVICE] if f not in got[name].families]
            assert not missing, f"{name} lacks {missing}"
        for name in ("admission", "quota", "placement", "preemption", "node-agents"):
            status, body = readyz(urls[name])
            assert status == 200 and body["ready"], (name, body)
        status, body = readyz(urls["placement-standby"])
        assert status == 503 and body["lease"] == {"name": "placement", "held": False}, body
        return got

    got = await eventually(families_and_health)
    idle = sorted({r.node for j in (low, urgent, big) for r in view.jobs[j].ranks} ^ set(view.nodes))[0]
    await c.drain(idle, message="maintenance")  # what `corral drain` and `corral hold` send
    await c.hold(big)

    def matches_the_commands() -> None:
        p = pages()
        jobs = [j for j in as_json(corral(stack, "jobs", "--json", "--all"))]
        queues = {q["queue"]: q for q in as_json(corral(stack, "queues", "--json"))}
        nodes = as_json(corral(stack, "nodes", "--json"))
        # corral jobs: jobs by queue and state; waiting ones by queue and reason code
        live = Counter((j["queue"], j["state"]) for j in jobs if j["state"] not in ("COMPLETED", "FAILED",
                                                                                    "CANCELLED", "REJECTED"))
        assert p["placement"].by("corral_jobs", "queue", "state") == {k: float(n) for k, n in live.items()}
        waiting = Counter((j["queue"], j["reason"].split(":")[0]) for j in jobs if j["state"] in ("PENDING", "HELD"))
        assert waiting[("team-b", "HELD")] == 1, jobs
        assert p["quota"].by("corral_pending_jobs", "queue", "reason") == {k: float(n) for k, n in waiting.items()}
        # corral queues: usage, guarantee, reservation, pending, fair share
        for name, row in queues.items():
            for family, key in (("corral_queue_used_gpus", "in_use"), ("corral_queue_guaranteed_gpus", "guaranteed"),
                                ("corral_queue_reserved_gpus", "reserved"), ("corral_queue_pending_jobs", "pending"),
                                ("corral_queue_fair_share_gpus", "fair_share")):
                assert p["quota"].values(family, queue=name) == [float(row[key])], (family, name, row)
        # corral nodes: GPUs by node and state, allocation ratio, heartbeats
        for row in nodes:
            gpus = p["placement"].by("corral_gpus", "state", node=row["node"])
            # a drained node's unallocated GPUs are `draining` (corral nodes counts them free)
            draining = row["free"] if row["state"] == "draining" else 0
            assert (gpus[("free",)], gpus[("draining",)]) == (row["free"] - draining, draining), (row, gpus)
            assert gpus[("releasing",)] == len(row["releasing"])
            assert gpus[("allocated",)] + gpus[("releasing",)] == row["used"] and gpus[("lost",)] == 0
            assert 0 <= p["placement"].values("corral_node_heartbeat_age_seconds", node=row["node"])[0] < 6
        assert [r["state"] for r in nodes if r["node"] == idle] == ["draining"]
        states = Counter(r["state"] for r in nodes)
        assert p["placement"].by("corral_nodes", "state") == {(s,): float(states[s]) for s in ("ready", "draining",
                                                                                                "lost")}
        used, total = sum(r["used"] for r in nodes), sum(r["gpus"] for r in nodes)
        assert p["placement"].values("corral_gpu_allocation_ratio") == [used / total]
        assert p["node-agents"].total("corral_node_agent_gpus") == total

    await eventually(matches_the_commands)

    # The counters are the log's: reservations, verdicts, the preemption, its requeue, the waits.
    p = got
    reserved = Counter(e.queue for e in log if isinstance(e, ev.QuotaReserved))
    assert p["quota"].by("corral_quota_reservations_total", "queue") == {(q,): float(n) for q, n in reserved.items()}
    admitted = sum(isinstance(e, ev.JobAdmitted) for e in log)
    assert p["admission"].values("corral_admission_attempts_total", result="admitted") == [float(admitted)]
    preempted = [e for e in log if isinstance(e, ev.PreemptRequested)]
    assert len(preempted) == 1
    assert p["preemption"].by("corral_preemptions_total", "queue", "reason") == {
        ("team-a", preempted[0].reason.code): 1.0}
    assert p["placement"].by("corral_job_requeues_total", "queue", "reason") == {("team-a", "PREEMPTED"): 1.0}
    assert p["placement"].total("corral_lost_gpu_seconds_total", reason="PREEMPTED") >= 0.0
    running = Counter(view.jobs[e.job_id].queue for e in log if isinstance(e, ev.JobRunning))
    assert p["placement"].by("corral_job_wait_to_running_seconds_count", "queue") == {
        (q,): float(n) for q, n in running.items()}
    for name in ("admission", "quota", "placement", "preemption"):
        assert p[name].total("corral_eventstore_append_duration_seconds_count") > 0, name
        assert p[name].total("corral_scheduling_cycle_duration_seconds_count") > 0, name
        assert p[name].values("corral_dlq_messages") == [0.0], name
        assert p[name].values("corral_relay_lag_seconds")[0] < 5.0, name
        assert p[name].by("corral_consumer_pending_messages", "durable"), name
    json_lines_name_their_job(stack, low)


def json_lines_name_their_job(stack: Stack, low: str) -> None:
    """CORRAL_LOG_FORMAT=json: every line of every service is a JSON object with a job id and a trace
    id field; the lines about the preempted job carry its id."""
    about_low = 0
    for name in ("admission", "quota", "placement", "placement-standby", "preemption"):
        for text in stack.process(name).log_path.read_text().splitlines():
            if not text.strip():
                continue
            line = json.loads(text)
            assert {"ts", "level", "logger", "message", "job_id", "trace_id", "service"} <= set(line), line
            assert line["service"] == name.removesuffix("-standby")
            about_low += line["job_id"] == low
    assert about_low >= 2, "placement (either process) logs the release, preemption the request, each naming the job"
