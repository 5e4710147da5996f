"""Limits per person and per queue, and one validation everywhere, end to end.

A queues file sets `max_submitted_per_user` (admission refuses past it: LIMIT_SUBMITTED),
`submit_rate_per_user` (a token bucket: a burst is absorbed, then RATE_LIMITED with when to retry)
and `max_gpus_per_user` (quota keeps a job waiting: MAX_GPUS_PER_USER, shown by `corral why`).
A spec the node agent could never start (an env name the agent sets itself, an unknown checkpoint
signal) is refused by `corral validate` and `corral submit` with the field and the fix, and a
job that still cannot start (its command is not there) fails with that reason, not "rank 0 was
killed".
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from corral.contracts import events as ev
from corral.contracts.envelope import new_event_id
from corral.contracts.jobspec import validate_job_spec
from corral.projection import JobState
from tests.e2e.conftest import StackFactory, connect, dump_logs, with_queues
from tests.e2e.test_cli import as_json, corral, write


def sim_job(name: str, queue: str, gpus: int = 1, seconds: float = 600) -> object:
    return validate_job_spec({"name": name, "queue": queue, "gpus_per_replica": gpus, "runtime": "sim",
                              "duration_seconds": seconds})


async def test_one_user_is_stopped_at_the_queues_max_submitted_per_user(make_stack: StackFactory, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    stack = make_stack(cluster="1x8:H100")
    c = await connect(stack)
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 8, "max_submitted_per_user": 5}], nodes=1)
        # 12 submissions from alice (a flood); bob is not held to alice's count
        jobs = [await c.submit(sim_job(f"a{i}", "team-a"), user="alice") for i in range(12)]  # type: ignore[arg-type]
        verdicts = [await c.verdict(j, 60) for j in jobs]
        admitted = [v for v in verdicts if isinstance(v, ev.JobAdmitted)]
        rejected = [v for v in verdicts if isinstance(v, ev.JobRejected)]
        assert len(admitted) == 5 and len(rejected) == 7, dump_logs(stack)
        reason = rejected[0].reason
        assert reason.code == "LIMIT_SUBMITTED"
        assert "max_submitted_per_user" in reason.message and "5" in reason.message
        assert reason.details["limit"] == 5 and reason.details["count"] == 5
        assert rejected[0].problems and rejected[0].problems[0].path == "queue"
        bob = await c.submit(sim_job("b0", "team-a"), user="bob")  # type: ignore[arg-type]
        assert isinstance(await c.verdict(bob, 60), ev.JobAdmitted)
        # `corral submit` as alice: exit 1, the limit and the count named
        monkeypatch.setenv("USER", "alice")
        path = write(tmp_path, "one-more.yaml", "name: one-more\nqueue: team-a\nruntime: sim\nduration_seconds: 5\n")
        proc = corral(stack, "submit", path, check=False)
        assert proc.returncode == 1 and "LIMIT_SUBMITTED" in proc.stderr, (proc.stdout, proc.stderr)
        assert "max_submitted_per_user is 5" in proc.stderr
        # `corral jobs` shows a page and says how many more match; --json lists every one
        active = [v.job_id for v in admitted] + [bob]
        page = corral(stack, "jobs", "--limit", "3")
        assert sum(job in page.stdout for job in active) == 3, page.stdout
        assert "3 more (6 match" in page.stderr and "--limit 0" in page.stderr, page.stderr
        assert {r["id"] for r in as_json(corral(stack, "jobs", "--json"))} == set(active)
        # one of alice's jobs ends: she may submit one more
        first = next(v.job_id for v in admitted)
        await c.cancel(first, user="alice")
        await c.wait_for(lambda v: v.jobs[first].state is JobState.CANCELLED, 60)
        again = await c.submit(sim_job("a-again", "team-a"), user="alice")  # type: ignore[arg-type]
        assert isinstance(await c.verdict(again, 60), ev.JobAdmitted)
    finally:
        await c.close()


async def test_a_burst_is_absorbed_then_rate_limited_with_when_to_retry(make_stack: StackFactory) -> None:
    stack = make_stack(cluster="1x8:H100")
    c = await connect(stack)
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 8,
                               "submit_rate_per_user": {"per_minute": 1, "burst": 4}}], nodes=1)
        jobs = [await c.submit(sim_job(f"r{i}", "team-a", seconds=1), user="alice")  # type: ignore[arg-type]
                for i in range(7)]
        verdicts = [await c.verdict(j, 60) for j in jobs]
        kinds = [type(v).__name__ for v in verdicts]
        assert kinds == ["JobAdmitted"] * 4 + ["JobRejected"] * 3, kinds
        limited = verdicts[4]
        assert isinstance(limited, ev.JobRejected) and limited.reason.code == "RATE_LIMITED"
        assert 0 < float(limited.reason.details["retry_after_seconds"]) <= 60
        assert "retry" in limited.reason.message
        bob = await c.submit(sim_job("b0", "team-a", seconds=1), user="bob")  # type: ignore[arg-type]
        assert isinstance(await c.verdict(bob, 60), ev.JobAdmitted)
    finally:
        await c.close()


async def test_a_user_over_max_gpus_per_user_waits_with_the_limit_named(make_stack: StackFactory,
                                                                        tmp_path: Path) -> None:
    stack = make_stack(cluster="2x8:H100")
    c = await connect(stack)
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 16, "max_gpus_per_user": 8}], nodes=2)
        first = [await c.submit(sim_job(f"g{i}", "team-a", gpus=4), user="alice") for i in range(2)]  # type: ignore[arg-type]
        await c.wait_for(lambda v: all(v.jobs[j].state is JobState.RUNNING for j in first if j in v.jobs)
                         and all(j in v.jobs for j in first), 60)
        third = await c.submit(sim_job("g2", "team-a", gpus=4), user="alice")  # type: ignore[arg-type]
        view = await c.wait_for(lambda v: third in v.jobs and v.jobs[third].reason is not None
                                and v.jobs[third].reason.code == "MAX_GPUS_PER_USER", 60)
        assert view.jobs[third].state is JobState.PENDING
        assert "max_gpus_per_user" in view.jobs[third].reason.message  # type: ignore[union-attr]
        why = as_json(corral(stack, "why", third, "--json"))
        assert why["blocker"]["code"] == "MAX_GPUS_PER_USER" and "8" in why["blocker"]["message"]
        # bob's job runs on the free GPUs alice may not use
        bob = await c.submit(sim_job("b0", "team-a", gpus=4), user="bob")  # type: ignore[arg-type]
        await c.wait_for(lambda v: bob in v.jobs and v.jobs[bob].state is JobState.RUNNING, 60)
        # alice's first job ends: her third one runs
        await c.cancel(first[0], user="alice")
        await c.wait_for(lambda v: v.jobs[third].state is JobState.RUNNING, 60)
    finally:
        await c.close()


async def test_a_spec_the_agent_would_refuse_is_refused_before_anything_is_spent(
        make_stack: StackFactory, tmp_path: Path) -> None:
    stack = make_stack(cluster="1x8:H100")
    c = await connect(stack)
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 8}], nodes=1)
        cases = {
            "env.NVIDIA_VISIBLE_DEVICES": "env: {NVIDIA_VISIBLE_DEVICES: '0,1'}\n",
            "checkpoint.signal": "checkpoint: {signal: SIGFOO}\n",
        }
        for field, extra in cases.items():
            path = write(tmp_path, "bad.yaml", "name: bad\nqueue: team-a\ngpus_per_replica: 1\n"
                                               "runtime: sim\nduration_seconds: 5\n" + extra)
            for command in ("validate", "submit"):
                proc = corral(stack, command, path, check=False)
                assert proc.returncode == 1, (command, proc.stdout, proc.stderr)
                assert field in proc.stderr and "hint" in proc.stderr, proc.stderr
        assert await c.events(types=["JobSubmitted"]) == []
        # a pipeline that skips the client's checks: admission refuses it, naming the field
        raw = {"type": "JobSubmitted", "schema_version": 2, "event_id": new_event_id(time.time()),
               "stream": "job-jraw1", "occurred_at": "2026-12-07T00:00:00Z", "actor": "user/alice",
               "correlation_id": "jraw1", "job_id": "jraw1", "user": "alice",
               "spec": {"name": "raw", "queue": "team-a", "runtime": "sim", "duration_seconds": 5,
                        "env": {"CUDA_VISIBLE_DEVICES": "3"}}}
        await c.bus.publish(c.subjects.user_request("alice", "JobSubmitted"), json.dumps(raw).encode(), "raw-1")
        verdict = await c.verdict("jraw1", 60)
        assert isinstance(verdict, ev.JobRejected), verdict
        assert verdict.reason.code == "SPEC_INVALID"
        assert verdict.problems and verdict.problems[0].path == "spec.env.CUDA_VISIBLE_DEVICES"
    finally:
        await c.close()


async def test_a_job_that_cannot_start_fails_with_the_start_failure(make_stack: StackFactory,
                                                                   tmp_path: Path) -> None:
    cluster_file = tmp_path / "cluster.json"
    cluster_file.write_text(json.dumps({"nodes": [{"name": "node-0", "gpus": 2, "model": "CPU"}]}))
    stack = make_stack(cluster=None, cluster_file=cluster_file, runtime="process")
    c = await connect(stack)
    try:
        await with_queues(c, [{"name": "team-a", "guaranteed_gpus": 2}], nodes=1)
        job = await c.submit(validate_job_spec({
            "name": "typo", "queue": "team-a", "replicas": 2, "gpus_per_replica": 1, "runtime": "process",
            "command": ["no-such-program-corral-test"], "workdir": os.fspath(tmp_path)}))
        view = await c.wait_for(lambda v: job in v.jobs and v.jobs[job].state.terminal, 90)
        assert view.jobs[job].state is JobState.FAILED, dump_logs(stack)
        [failed] = [e for _, e in await c.job_events(job) if isinstance(e, ev.JobFailed)]
        assert "was killed" not in failed.reason.message, failed.reason.message
        assert "could not start" in failed.reason.message
        assert "no-such-program-corral-test" in failed.reason.message, failed.reason.message
    finally:
        await c.close()
