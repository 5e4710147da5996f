"""The admin acts as the admin: its credential publishes only its own subjects.

The admin's NATS identity (the person who ran `corral up`) may publish its own user subjects
(`<ns>.inbox.user.<admin>.<Request>`: an admin is also a person who submits) and its admin
subjects (`<ns>.inbox.admin.<admin>.<Request>`), never another user's, a node's, or a bare
`<ns>.inbox.<Type>`; what it asks as an admin is recorded with `admin/<name>` as the actor.
The stack is `corral up`'s with its own authenticated NATS; alice and bob are submitters.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest

from corral.client import Client
from corral.contracts import events as ev
from corral.contracts.envelope import Reason, job_stream
from corral.contracts.queues import validate_queues
from corral.contracts.registry import encode
from corral.contracts.subjects import Subjects
from corral.stack.context import Context
from corral.stack.credentials import NatsCredentials
from corral.stack.up import Stack
from tests.e2e.conftest import handled, own_site
from tests.e2e.test_security import _refused, _spec

NS = "corral"


@pytest.fixture(scope="module")
async def people(postgres_server_dsn: str) -> AsyncIterator[Stack]:
    """`corral up` with its own (authenticated) NATS, 2 nodes x 8 GPUs, submitters alice and bob."""
    async with own_site(postgres_server_dsn, "corral-adm-", write_user_context=False,
                        submitters=("alice", "bob")) as stack:
        yield stack


def _ctx(stack: Stack, user: str | None) -> Context:
    assert stack.context is not None
    creds = stack.context.credentials if user is None else str(stack.options.data_dir / "credentials" / f"{user}.json")
    return Context(nats_url=stack.context.nats_url, postgres_dsn=stack.context.postgres_dsn, namespace=NS,
                   credentials=creds, nats_ca=stack.context.nats_ca)


def _admin_name(stack: Stack) -> str:
    assert stack.context is not None and stack.context.credentials
    return NatsCredentials.load(stack.context.credentials).user


async def _settled(client: Client) -> None:
    """Every request the bus took is handled (its consumers are done) and the view has caught up."""
    await handled(client.bus)
    await client.wait_for(lambda v: True, 5)


async def test_the_admin_cannot_submit_as_another_user(people: Stack) -> None:
    subjects = Subjects(NS)
    async with await Client.connect(_ctx(people, None)) as admin:
        job_id = "jforgedbob" + secrets.token_hex(3)
        forged = ev.JobSubmitted.new(stream=job_stream(job_id), actor="user/bob", job_id=job_id,
                                     spec=_spec(), user="bob")
        assert await _refused(admin.bus, subjects.user_request("bob", "JobSubmitted"), forged)
        assert await _refused(admin.bus, subjects.inbox("JobSubmitted"), forged)
        await _settled(admin)
        assert job_id not in (await admin.view()).jobs
        as_bob = [e for _, e in await admin.events(types=["JobSubmitted"])
                  if isinstance(e, ev.JobSubmitted) and e.user == "bob"]
        assert as_bob == []


async def test_the_admin_cannot_forge_a_node_report(people: Stack) -> None:
    async with await Client.connect(_ctx(people, "alice")) as alice:
        job_id = await alice.submit(_spec())
        view = await alice.wait_for(lambda v: job_id in v.jobs and v.jobs[job_id].state.name == "RUNNING", 30)
    job = view.jobs[job_id]
    node = job.ranks[0].node
    try:
        async with await Client.connect(_ctx(people, None)) as admin:
            forged = ev.WorkerExited.new(stream=job_stream(job_id), actor=f"node-agent/{node}", job_id=job_id,
                                         rank=0, node=node, exit_code=0, attempt=job.attempt,
                                         reason=Reason(code="COMPLETED", message="forged by the admin"))
            assert await _refused(admin.bus, Subjects(NS).node_report(node, "WorkerExited"), forged)
            assert await _refused(admin.bus, Subjects(NS).inbox("WorkerExited"), forged)
            await _settled(admin)
            after = (await admin.view()).jobs[job_id]
            assert after.state.name == "RUNNING" and after.attempt == job.attempt, after
            exits = [e for _, e in await admin.job_events(job_id) if isinstance(e, ev.WorkerExited)]
            assert exits == [], exits
    finally:
        async with await Client.connect(_ctx(people, "alice")) as alice:
            await alice.cancel(job_id)


async def test_the_admin_cancels_as_the_admin(people: Stack) -> None:
    """Cancelling another person's job is an admin request, on the admin's subject, recorded with
    the admin as the actor; the same request on the admin's user subject is refused (NOT_OWNER)."""
    admin_name = _admin_name(people)
    async with await Client.connect(_ctx(people, "bob")) as bob:
        job_id = await bob.submit(_spec())
        await bob.wait_for(lambda v: job_id in v.jobs and v.jobs[job_id].state.name == "RUNNING", 30)
    async with await Client.connect(_ctx(people, None)) as admin:
        as_person = ev.JobCancelRequested.new(stream=job_stream(job_id), actor=f"user/{admin_name}", job_id=job_id,
                                              user=admin_name, message="as a person")
        await admin.bus.publish(Subjects(NS).user_request(admin_name, "JobCancelRequested"),
                                encode(as_person), as_person.event_id)
        verdict = await admin.await_verdict(as_person, 20)
        assert isinstance(verdict.event, ev.AccessDenied) and verdict.event.reason.code == "NOT_OWNER", verdict
        await admin.cancel(job_id)
        view = await admin.wait_for(lambda v: v.jobs[job_id].state.terminal, 30)
        assert view.jobs[job_id].state.name == "CANCELLED"
        cancelled = [e for _, e in await admin.job_events(job_id) if isinstance(e, ev.JobCancelled)]
        assert cancelled and cancelled[0].actor == f"admin/{admin_name}", cancelled


async def test_queues_and_drains_are_recorded_as_the_admins(people: Stack) -> None:
    """`corral apply` and `corral drain` go on the admin's subjects and name the admin, whatever
    the message says; a report's body on the admin's drain subject is refused (dead-lettered)."""
    admin_name = _admin_name(people)
    async with await Client.connect(_ctx(people, None)) as admin:
        request = await admin.request_queue_tree(validate_queues({"queues": [{"name": "team-b",
                                                                               "guaranteed_gpus": 0}]}),
                                                 user="mallory")
        verdict = await admin.await_verdict(request, 20)
        assert isinstance(verdict.event, ev.QueueTreeApplied), verdict
        assert verdict.event.actor == f"admin/{admin_name}" and verdict.event.user == admin_name, verdict
        await admin.drain("node-1", message="maintenance")
        view = await admin.wait_for(lambda v: v.nodes["node-1"].draining, 20)
        drained = [e for _, e in await admin.events(types=["NodeDrained"]) if isinstance(e, ev.NodeDrained)]
        assert drained[-1].actor == f"admin/{admin_name}" and drained[-1].user == admin_name, drained
        # a WorkerExited body on the admin's own drain subject: the subject says NodeDrained
        job_id = "jmismatch" + secrets.token_hex(3)
        forged = ev.WorkerExited.new(stream=job_stream(job_id), actor="node-agent/node-0", job_id=job_id, rank=0,
                                     node="node-0", exit_code=0, reason=Reason(code="COMPLETED", message="forged"))
        await admin.bus.publish(Subjects(NS).admin_request(admin_name, "NodeDrained"), encode(forged),
                                forged.event_id, timeout=5.0)
        await admin.drain("node-1", undrain=True)
        view = await admin.wait_for(lambda v: not v.nodes["node-1"].draining, 20)
        assert not [e for _, e in await admin.events(types=["WorkerExited"])
                    if isinstance(e, ev.WorkerExited) and e.job_id == job_id]
        assert view.nodes["node-1"].draining is False


async def test_a_dead_letter_is_replayed_by_a_service_on_the_admins_request(people: Stack) -> None:
    """The admin cannot publish alice's subject, but a service replays alice's dead-lettered
    submission for it, recorded as alice's; a dead letter a node agent wrote (it may write those of
    the events stream only) is not replayed; a person cannot ask for a replay."""
    from corral.bus.delivery import (
        DLQ_CONSUMER,
        DLQ_DELIVERIES,
        DLQ_ERROR,
        DLQ_MSG_ID,
        DLQ_SEQUENCE,
        DLQ_STREAM,
        DLQ_SUBJECT,
    )
    from tests.e2e.test_security import _agent_user, _bus_as

    subjects = Subjects(NS)
    job_id = "jlostalice" + secrets.token_hex(3)
    lost = ev.JobSubmitted.new(stream=job_stream(job_id), actor="user/alice", job_id=job_id, spec=_spec(),
                               user="alice")
    forged_id = "jforgedbob" + secrets.token_hex(3)
    forged = ev.JobSubmitted.new(stream=job_stream(forged_id), actor="user/bob", job_id=forged_id, spec=_spec(),
                                 user="bob")

    def headers(subject: str, stream: str, msg_id: str) -> dict[str, str]:
        return {DLQ_SUBJECT: subject, DLQ_STREAM: stream, DLQ_SEQUENCE: "3", DLQ_CONSUMER: "admission-inbox",
                DLQ_DELIVERIES: "5", DLQ_MSG_ID: msg_id, DLQ_ERROR: "failed 5 times; last: ConnectionRefusedError"}

    async with _bus_as(people, "svc-admission") as svc:  # as admission dead-letters a request
        inbox = svc.names.stream("inbox")
        seq = 10**6 + secrets.randbelow(10**6)
        taken = await svc.publish(svc.names.dead_letter_subject(inbox, seq), encode(lost), f"dlq-{job_id}",
                                  headers(subjects.user_request("alice", "JobSubmitted"), inbox, f"lost-{job_id}"))
    async with _bus_as(people, _agent_user(people)) as agent:  # a stolen agent credential
        events = agent.names.stream("events")
        forged_letter = await agent.publish(agent.names.dead_letter_subject(events, 10**6 + 7), encode(forged),
                                            f"dlq-{forged_id}",
                                            headers(subjects.user_request("bob", "JobSubmitted"), events,
                                                    f"lost-{forged_id}"))
    async with await Client.connect(_ctx(people, None)) as admin:
        assert await _refused(admin.bus, subjects.user_request("alice", "JobSubmitted"), lost)
        rows = await admin.replay_dead_letters(taken.sequence)
        assert rows[0]["replayed"] is True, rows
        view = await admin.wait_for(lambda v: job_id in v.jobs, 30)
        assert view.jobs[job_id].user == "alice"
        rows = await admin.replay_dead_letters(forged_letter.sequence)
        assert rows[0]["replayed"] is False and "only requests are replayed" in str(rows[0]["message"]), rows
        await _settled(admin)
        assert forged_id not in (await admin.view()).jobs
        await admin.cancel(job_id)
    async with await Client.connect(_ctx(people, "bob")) as bob:
        with pytest.raises((TimeoutError, RuntimeError)):
            await bob.replay_dead_letters(forged_letter.sequence, timeout=2.0)


def _cli_as(stack: Stack, user: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    """`corral ARGS` with a context file holding `user`'s login (None: the admin's)."""
    return _cli_with(stack, _ctx(stack, user), *args)


def _cli_with(stack: Stack, ctx: Context, *args: str) -> subprocess.CompletedProcess[str]:
    path = stack.options.data_dir / f"context-{secrets.token_hex(4)}.json"
    ctx.save(path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update({"CORRAL_CONTEXT": str(path), "COLUMNS": "200", "CORRAL_LOG_DIR": "/nonexistent"})
    return subprocess.run([sys.executable, "-m", "corral.cli.main", *args], text=True, capture_output=True, env=env,
                          timeout=120)


async def test_a_person_follows_their_own_jobs_logs_and_no_one_elses(people: Stack) -> None:
    """Log subjects name the job's owner: alice reads her job's output, bob cannot (the bus
    refuses his consumer on her subjects, also one whose request body names them under his own
    filter; `corral logs` says whose job it is and exits 1), the admin reads every job's."""
    from corral.log_stream import LogQuery, LogStreamUnavailable, read_chunks
    from tests.e2e.test_security import _api, _bus_as

    async with await Client.connect(_ctx(people, "alice")) as alice:
        job_id = await alice.submit(_spec())
        await alice.wait_for(lambda v: job_id in v.jobs and v.jobs[job_id].state.name == "RUNNING", 30)
        lines: list[str] = []
        for _ in range(30):
            chunks: list[Any] = []
            await read_chunks(alice.bus, LogQuery(job_id, owner="alice"), chunks.append)
            lines = [line for c in chunks for line in c.lines]
            if any("sim rank=0" in line for line in lines):
                break
            await asyncio.sleep(0.5)
        assert any("sim rank=0" in line for line in lines), lines
    try:
        async with _bus_as(people, "bob") as bob:
            with pytest.raises(LogStreamUnavailable):
                await read_chunks(bob, LogQuery(job_id, owner="alice"), lambda _: None, timeout=1.0)
            with pytest.raises(LogStreamUnavailable):
                await read_chunks(bob, LogQuery(job_id), lambda _: None, timeout=1.0)  # every owner's
            mine: list[Any] = []
            await read_chunks(bob, LogQuery(job_id, owner="bob"), mine.append, timeout=2.0)
            assert mine == []
            stream = bob.names.stream("logs")
            own, hers = f"{NS}.logs.user.bob.{job_id}.*.*.*", f"{NS}.logs.user.alice.{job_id}.*.*.*"
            for config in ({"name": "peek1", "filter_subject": hers},
                           {"name": "peek2", "filter_subjects": [hers]},
                           {"name": "peek3", "filter_subjects": [own, hers]}):
                answer = await _api(bob, f"$JS.API.CONSUMER.CREATE.{stream}.{config['name']}.{own}",
                                    {"stream_name": stream, "config": {**config, "deliver_policy": "all",
                                                                       "ack_policy": "none"}})
                assert answer is not None and "error" in answer, (config, answer)
        async with await Client.connect(_ctx(people, None)) as admin:
            seen: list[Any] = []
            await read_chunks(admin.bus, LogQuery(job_id), seen.append)
            assert any("sim rank=0" in line for c in seen for line in c.lines)
        as_alice = await asyncio.to_thread(_cli_as, people, "alice", "logs", job_id)
        assert as_alice.returncode == 0 and "sim rank=0" in as_alice.stdout, as_alice
        as_bob = await asyncio.to_thread(_cli_as, people, "bob", "logs", job_id)
        assert as_bob.returncode == 1 and "alice's" in as_bob.stderr and "sim rank=0" not in as_bob.stdout, as_bob
        as_admin = await asyncio.to_thread(_cli_as, people, None, "logs", job_id)
        assert as_admin.returncode == 0 and "sim rank=0" in as_admin.stdout, as_admin
    finally:
        async with await Client.connect(_ctx(people, "alice")) as alice:
            await alice.cancel(job_id)


def _person_dsn(stack: Stack, user: str) -> str:
    from corral.stack import pglogins

    assert stack.context is not None
    database = urlsplit(stack.context.postgres_dsn).path.lstrip("/")
    return pglogins.with_login(stack.context.postgres_dsn, pglogins.person_login(database, user),
                               pglogins.person_pgpass(stack.options.data_dir, user))


async def test_a_persons_login_reads_everyones_jobs_but_only_their_own_env_values(people: Stack) -> None:
    """Slurm's PrivateData for env: alice's own Postgres login (in corral_person) reads her job's
    env values and every job's state, never bob's env values (nor the raw table, nor the hash
    that would check a guess); the read model stores no env value; `corral jobs`, `why` and `show`
    work for both jobs with her login."""
    async with await Client.connect(_ctx(people, "alice")) as alice:
        sid = "nightly-" + secrets.token_hex(3)
        hers = await alice.submit(_spec(env={"API_TOKEN": "alice-s3cret"}, submission_id=sid))
    async with await Client.connect(_ctx(people, "bob")) as bob:
        his = await bob.submit(_spec(env={"API_TOKEN": "bob-s3cret"}))
        await bob.wait_for(lambda v: hers in v.jobs and his in v.jobs, 30)
    conn = await asyncpg.connect(_person_dsn(people, "alice"))
    try:
        assert await conn.fetchval("SELECT current_setting('search_path')") == "person_view, public"
        submitted = {r["stream"]: r["data"] for r in await conn.fetch(
            "SELECT stream, data::text AS data FROM events WHERE type = 'JobSubmitted' AND stream = ANY($1)",
            [job_stream(hers), job_stream(his)])}
        assert "alice-s3cret" in submitted[job_stream(hers)]
        assert "bob-s3cret" not in submitted[job_stream(his)] and "API_TOKEN" in submitted[job_stream(his)]
        assert await conn.fetchval("SELECT count(*) FROM events WHERE hash IS NOT NULL") == 0
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.fetchval("SELECT count(*) FROM public.events")
        # her submission id's job, from the index on public.events (not a scan of the view)
        assert await conn.fetchval("SELECT job_of_submission('alice', $1)", sid) == hers
    finally:
        await conn.close()
    reader = await asyncpg.connect(people.context.postgres_dsn)  # type: ignore[union-attr]
    try:  # the projector's stored views: every job's spec, no env value
        head = await reader.fetchval("SELECT max(position) FROM events WHERE stream = ANY($1)",
                                     [job_stream(hers), job_stream(his)])
        for _ in range(60):
            if (await reader.fetchval("SELECT max(position) FROM view_snapshots") or 0) >= head:
                break
            await asyncio.sleep(0.5)
        blobs = [r["data"] for r in await reader.fetch("SELECT data FROM view_snapshots UNION ALL "
                                                       "SELECT data FROM view_jobs")]
        assert blobs and not any(b"s3cret" in bytes(b) for b in blobs)
    finally:
        await reader.close()
    ctx = Context(nats_url=people.context.nats_url, postgres_dsn=_person_dsn(people, "alice"),  # type: ignore[union-attr]
                  namespace=NS, credentials=str(people.options.data_dir / "credentials" / "alice.json"),
                  nats_ca=people.context.nats_ca)  # type: ignore[union-attr]
    try:
        listed = await asyncio.to_thread(_cli_with, people, ctx, "jobs", "--json")
        assert listed.returncode == 0 and hers in listed.stdout and his in listed.stdout, listed
        for job, secret, seen in ((hers, "alice-s3cret", True), (his, "bob-s3cret", False)):
            shown = await asyncio.to_thread(_cli_with, people, ctx, "show", job, "--json")
            assert shown.returncode == 0 and (secret in shown.stdout) is seen, shown
            why = await asyncio.to_thread(_cli_with, people, ctx, "why", job)
            assert why.returncode == 0 and job in why.stdout and "bob-s3cret" not in why.stdout, why
    finally:
        async with await Client.connect(_ctx(people, None)) as admin:
            for job in (hers, his):
                await admin.cancel(job)
