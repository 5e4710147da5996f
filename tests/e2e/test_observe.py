"""Seeing a running cluster: one trace per job across every process, and the views
built from the log (`corral top`, `corral usage`), on one stack.

The stack's processes and the CLI each append their spans to one JSON-lines file
(`CORRAL_TRACE_FILE`); the test reads it back and checks the trace of one gang job.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from corral.contracts import events as ev
from corral.contracts.jobspec import validate_job_spec
from corral.projection import JobState
from corral.telemetry.tracing import load_spans
from tests.e2e.conftest import StackFactory, connect, with_queues
from tests.e2e.test_cli import as_json, cli_env, corral, job_yaml, wait_state, write

SERVICES = {"corral-cli", "admission", "quota", "placement", "preemption", "node-agent"}


def _trace_of(spans: list[dict[str, Any]], job: str) -> list[dict[str, Any]]:
    roots = [s for s in spans if s["name"] == "corral submit" and s["attributes"].get("corral.job_id") == job]
    assert len(roots) == 1, [s["name"] for s in spans][:20]
    return [s for s in spans if s["trace_id"] == roots[0]["trace_id"]]


def _usage_from_log(events: list[Any]) -> dict[str, tuple[float, float]]:
    """Each job's GPU-hours used (placement to each node's GpusReleased) and waited (admitted to
    placed), from the raw events: the plain sums `corral usage` must agree with."""
    admitted: dict[str, datetime] = {}
    placed: dict[str, datetime] = {}
    used: dict[str, float] = {}
    gpus: dict[str, int] = {}
    for e in events:
        if isinstance(e, ev.JobAdmitted):
            admitted[e.job_id], gpus[e.job_id] = e.occurred_at, e.replicas * e.gpus_per_replica
        elif isinstance(e, ev.GangReserved):
            placed[e.job_id] = e.occurred_at
        elif isinstance(e, ev.GpusReleased):
            held = (e.occurred_at - placed[e.job_id]).total_seconds() * len(e.gpus)
            used[e.job_id] = used.get(e.job_id, 0.0) + held
    return {j: (used[j] / 3600, gpus[j] * (placed[j] - admitted[j]).total_seconds() / 3600) for j in used}


def _path_to_root(span: dict[str, Any], by_id: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    path = [span]
    while path[-1]["parent_span_id"] is not None:
        path.append(by_id[path[-1]["parent_span_id"]])
    return list(reversed(path))


async def test_one_trace_per_job_and_usage_and_top_from_the_log(make_stack: StackFactory, tmp_path: Path) -> None:
    trace_file = tmp_path / "spans.jsonl"
    stack = make_stack(env={"CORRAL_TRACE_FILE": str(trace_file)})
    c = await connect(stack)
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 16}, {"name": "team-b", "guaranteed_gpus": 16}], 4)
        spec = write(tmp_path, "gang.yaml", job_yaml("gang", "team-a", 2, 8, 600))
        env = {**cli_env(stack), "CORRAL_TRACE_FILE": str(trace_file)}
        submitted = subprocess.run([sys.executable, "-m", "corral.cli.main", "submit", spec, "--json"],
                                   text=True, capture_output=True, env=env, timeout=60, check=True)
        job = as_json(submitted)["id"]
        # a short job of another queue alongside (for `corral usage` below), submitted as a pipeline would
        quick = await c.submit(validate_job_spec({"name": "q", "queue": "team-b", "replicas": 1, "gpus_per_replica": 2,
                                                  "runtime": "sim", "duration_seconds": 1}))
        await wait_state(c, job, JobState.RUNNING)

        trace: list[dict[str, Any]] = []
        for _ in range(50):  # the last spans (placement's JobRunning append) land a moment later
            trace = _trace_of(load_spans(trace_file), job)
            if {s["service"] for s in trace} >= SERVICES and any(
                    "JobRunning" in s["attributes"].get("corral.event_types", []) for s in trace):
                break
            await asyncio.sleep(0.2)
        by_id = {s["span_id"]: s for s in trace}
        # One trace: every span's parent is in it, and one root, the submit.
        roots = [s for s in trace if s["parent_span_id"] is None]
        assert [r["name"] for r in roots] == ["corral submit"]
        assert all(s["parent_span_id"] is None or s["parent_span_id"] in by_id for s in trace)
        # It covers every service the job passed through, each in a process of its own.
        assert {s["service"] for s in trace} >= SERVICES, sorted({s["service"] for s in trace})
        # Causal order: a parent starts before its children.
        assert all(by_id[s["parent_span_id"]]["start"] <= s["start"] for s in trace if s["parent_span_id"])
        # The path to each rank's WorkerStarted, as placement appended it, runs submit -> admission
        # -> quota -> placement -> node agent -> placement, with asyncpg appends on the way.
        started = [s for s in trace if s["service"] == "placement"
                   and "WorkerStarted" in s["attributes"].get("corral.event_types", [])]
        assert started, sorted({s["name"] for s in trace})
        path = _path_to_root(started[0], by_id)
        # (the relay's spans are in whichever process holds the relay lease: not a hop of the job)
        services = [s["service"] for s in path if not s["name"].startswith("relay ")]
        hops = [x for i, x in enumerate(services) if i == 0 or services[i - 1] != x]
        assert hops == ["corral-cli", "admission", "quota", "placement", "node-agent", "placement"], \
            [(s["service"], s["name"]) for s in path]
        assert [s["name"].split()[0] for s in path].count("relay") >= 3
        appends = [s for s in path if s["name"].startswith("corral_append")]
        assert {s["service"] for s in appends} >= {"admission", "quota", "placement"}
        assert all(s["attributes"]["db.system"] == "postgresql" for s in appends)
        # The log keeps each event's trace context beside it, outside the event.
        stored = await c.store.read_stream(f"job-{job}")
        assert all(e.trace_context and e.trace_context.split("-")[1] == roots[0]["trace_id"] for e in stored)

        # `corral top`: one frame, as a table and as JSON, of the running cluster.
        frame = as_json(corral(stack, "top", "--json"))
        assert len(frame["nodes"]) == 4 and frame["summary"]["gpus_allocated"] >= 16
        assert {q["queue"] for q in frame["queues"]} == {"team-a", "team-b"}
        screen = corral(stack, "top", "--once").stdout
        assert "corral top" in screen and job[-6:] in screen and "FAIR SHARE" in screen  # the map shows id tails

        # `corral usage`: the short job completed, the gang cancelled; totals against sums computed here.
        await c.cancel(job)
        await wait_state(c, quick, JobState.COMPLETED)
        await c.wait_for(lambda v: not v.jobs[job].holding and not v.jobs[job].fences and not v.jobs[quick].fences, 30)
        usage = as_json(corral(stack, "usage", "--by", "job", "--json"))
        expected = _usage_from_log([e for _, e in await c.events()])
        got = {r["job"]: (r["used_gpu_hours"], r["waited_gpu_hours"]) for r in usage["rows"]}
        assert set(got) == set(expected) == {job, quick}
        for j, (used, waited) in expected.items():
            assert abs(got[j][0] - used) < 1e-9 and abs(got[j][1] - waited) < 1e-9, (j, got[j], used, waited)
        by_queue = as_json(corral(stack, "usage", "--by", "queue", "--json"))
        assert abs(by_queue["total"]["used_gpu_hours"] - sum(u for u, _ in expected.values())) < 1e-9
        assert {r["queue"] for r in by_queue["rows"]} == {"team-a", "team-b"}
    finally:
        await c.close()
    assert os.path.getsize(trace_file) > 0
