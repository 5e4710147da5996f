"""Every request gets a verdict, and a submission id belongs to its user.

One `corral up` stack with its own authenticated NATS and two people, alice and bob, each with
their own login; every command runs as a real `corral` process with that person's context.

- A submission id is scoped to its user: bob's submission with alice's id is bob's own job (it
  was answered with alice's job and never existed), and each user's resubmission is answered
  with their own job (idempotence per user).
- A refused request is an exit code: alice's `corral cancel` of bob's job printed "Cancellation
  requested" and exited 0 while the log held `AccessDenied NOT_OWNER`.
- A verdict that does not come within the wait says so, with its own exit code.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from corral.cli.exit_codes import ExitCode
from corral.client import Client
from corral.contracts.envelope import job_stream
from corral.contracts.jobspec import JobSpec
from corral.projection import JobState
from corral.stack.context import Context
from corral.stack.up import Stack
from corral.verdicts import VerdictKind
from tests.e2e.conftest import own_site

NS = "corral"
PEOPLE = ("alice", "bob")


@pytest.fixture(scope="module")
async def people(postgres_server_dsn: str) -> AsyncIterator[Stack]:
    """`corral up` with its own (authenticated) NATS, 2 nodes x 8 GPUs, submitters alice and bob."""
    async with own_site(postgres_server_dsn, "corral-verdicts-", write_user_context=False,
                        submitters=PEOPLE) as stack:
        ctx, data = stack.context, stack.options.data_dir
        assert ctx is not None
        for user in PEOPLE:
            Context(nats_url=ctx.nats_url, postgres_dsn=ctx.postgres_dsn, namespace=NS, nats_ca=ctx.nats_ca,
                    credentials=str(data / "credentials" / f"{user}.json")).save(data / f"{user}.json")
        yield stack


def corral_as(stack: Stack, user: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`corral ARGS` as `user` (their own context and login), never raising on its exit code."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env |= {"CORRAL_CONTEXT": str(stack.options.data_dir / f"{user}.json"), "COLUMNS": "200", "USER": user,
            "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "corral.cli.main", *args], input=stdin, text=True,
                          capture_output=True, env=env, timeout=150)


def submitted(stack: Stack, user: str, spec: str) -> dict[str, Any]:
    out = corral_as(stack, user, "submit", "-", "--json", stdin=spec)
    assert out.returncode == 0, out
    return dict(json.loads(out.stdout))


def nightly(name: str) -> str:
    return (f"name: {name}\nqueue: team-a\nreplicas: 1\ngpus_per_replica: 8\nruntime: sim\n"
            "duration_seconds: 600\nsubmission_id: nightly-2026-12-07\n")


def _spec_dict() -> dict[str, Any]:
    return {"name": "bobs", "queue": "team-a", "replicas": 1, "gpus_per_replica": 8, "runtime": "sim",
            "duration_seconds": 600}


def _spec() -> JobSpec:
    return msgspec.convert(_spec_dict(), JobSpec)


async def test_a_submission_id_belongs_to_its_user(people: Stack) -> None:
    alice = submitted(people, "alice", nightly("alice-nightly"))
    bob = submitted(people, "bob", nightly("bob-nightly"))
    assert alice["state"] == bob["state"] == "ADMITTED" and alice["verdict"] == bob["verdict"] == "done", (alice, bob)
    assert bob["id"] != alice["id"], "bob was answered with alice's job"
    assert people.context is not None
    async with await Client.connect(people.context, bus=False) as c:
        view = await c.wait_for(lambda v: all(j in v.jobs and v.jobs[j].state is JobState.RUNNING
                                              for j in (alice["id"], bob["id"])), 60)
        for user, job in (("alice", alice["id"]), ("bob", bob["id"])):
            j = view.jobs[job]
            assert j.user == user and j.spec is not None and j.spec.name == f"{user}-nightly", j
        # Each user's resubmission is answered with their own job, and creates nothing.
        assert submitted(people, "alice", nightly("alice-again"))["id"] == alice["id"]
        again = corral_as(people, "bob", "submit", "-", stdin=nightly("bob-again"))
        assert again.returncode == 0 and f"Submitted job {bob['id']}" in again.stdout, again
        # Past JetStream's duplicate window (another msg id), admission drops it by (user, id).
        async with await Client.connect(Context.load(people.options.data_dir / "alice.json")) as alice_c:
            spec = msgspec.convert({**_spec_dict(), "submission_id": "nightly-2026-12-07"}, JobSpec)
            late = alice_c.submission(spec)
            await alice_c.publish_request(late, msg_id="after-the-window")
            for _ in range(200):
                if await c.store.was_processed("admission", "after-the-window"):
                    break
                await asyncio.sleep(0.1)
            assert await c.store.stream_version(job_stream(late.job_id)) == 0
            verdict = await alice_c.await_verdict(late, 30)
            assert verdict.kind is VerdictKind.DONE and verdict.job_id == alice["id"], verdict
        jobs = [j for j in (await c.view()).jobs.values()
                if j.spec is not None and j.spec.submission_id == "nightly-2026-12-07"]
        assert sorted(j.user for j in jobs) == ["alice", "bob"], jobs
    for user, job in (("alice", alice["id"]), ("bob", bob["id"])):
        done = corral_as(people, user, "cancel", job, "--json")
        assert done.returncode == 0 and json.loads(done.stdout)["verdict"] == "done", done


async def test_a_refused_request_exits_non_zero_with_its_reason(people: Stack) -> None:
    assert people.context is not None
    bob_ctx = Context.load(people.options.data_dir / "bob.json")
    async with await Client.connect(bob_ctx) as bob:
        job = await bob.submit(_spec())
        await bob.wait_for(lambda v: job in v.jobs and v.jobs[job].state is JobState.RUNNING, 60, job_ids=[job])
        refused = corral_as(people, "alice", "cancel", job)
        assert refused.returncode == ExitCode.REFUSED, refused
        assert "refused" in refused.stderr and "NOT_OWNER" in refused.stderr, refused.stderr
        assert "alice may not cancel a job of bob" in refused.stderr, refused.stderr
        assert "requested" not in refused.stdout, refused.stdout
        shown = corral_as(people, "alice", "requeue", job, "--json")
        assert shown.returncode == ExitCode.REFUSED, shown
        verdict = json.loads(shown.stdout)
        assert verdict["verdict"] == "refused" and verdict["reason"]["code"] == "NOT_OWNER", verdict
        assert verdict["id"] == job and verdict["request"] == "JobRequeueRequested", verdict
        view = await bob.live_view(job_ids=[job])
        assert view.jobs[job].state is JobState.RUNNING and view.jobs[job].attempt == 0
        # An admin's request from a person's login is refused before it is sent: exit 4 too.
        drained = corral_as(people, "bob", "drain", "node-0")
        assert drained.returncode == ExitCode.REFUSED and "needs the admin's login" in drained.stderr, drained

        # A verdict that does not come within the wait: its own code, and the request may still be acted on.
        admission = people.process("admission")
        admission.stop()
        try:
            late = corral_as(people, "bob", "cancel", job, "--verdict-timeout", "2")
            assert late.returncode == ExitCode.NO_VERDICT, late
            assert "may still" in late.stderr, late.stderr
        finally:
            admission.start()
        await bob.wait_for(lambda v: v.jobs[job].state is JobState.CANCELLED, 60, job_ids=[job])
        # Asked again, the job is over: nothing to do, said so.
        again = corral_as(people, "bob", "cancel", job, "--json")
        assert again.returncode == ExitCode.FAILURE and json.loads(again.stdout)["verdict"] == "unchanged", again
