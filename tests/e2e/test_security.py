"""Who may do what on the bus: one test per attack possible on an open NATS.

Without NATS identities (`corral.bus.auth`) each attack here succeeds: a plain `nats.connect(url)`
publishes a GangReserved that runs a forged command as root, forged reports change jobs, anyone
submits as alice or cancels her jobs. The stack is `corral up`'s, with its own NATS (auth on),
on the session Postgres; the attacker holds a stolen node-agent credential or a plain submitter's.

The same stack's Postgres logins (`corral.stack.pglogins`): a service connected as the superuser
could rewrite the log at will (`session_replication_role`, `DISABLE TRIGGER`), so each connects
with its own login in `corral_service`, the CLI with one in `corral_reader`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import ssl
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import msgspec
import nats
import pytest

from corral.bus import Bus
from corral.bus.naming import history_consumer
from corral.client import Client
from corral.contracts import events as ev
from corral.contracts.envelope import Reason, job_stream
from corral.contracts.jobspec import JobSpec
from corral.contracts.queues import validate_queues
from corral.contracts.registry import encode
from corral.contracts.subjects import Subjects
from corral.stack.context import Context
from corral.stack.up import Stack
from tests.e2e.conftest import handled, own_site
from tests.nats_refusals import refused

NS = "corral"


@pytest.fixture(scope="module")
async def secured(postgres_server_dsn: str) -> AsyncIterator[Stack]:
    """`corral up` with its own (authenticated) NATS, 2 nodes x 8 GPUs, submitter `bob`."""
    async with own_site(postgres_server_dsn, "corral-sec-", write_user_context=False, submitters=("bob",)) as stack:
        yield stack


def _ctx(stack: Stack, user: str | None) -> Context:
    assert stack.context is not None
    # None: the admin, i.e. the person who ran `corral up` (the context's credentials)
    creds = stack.context.credentials if user is None else str(stack.options.data_dir / "credentials" / f"{user}.json")
    return Context(nats_url=stack.context.nats_url, postgres_dsn=stack.context.postgres_dsn, namespace=NS,
                   credentials=creds, nats_ca=stack.context.nats_ca)


def _agent_user(stack: Stack) -> str:
    return next(p.stem for p in (stack.options.data_dir / "credentials").glob("agent-*.json"))


@contextlib.asynccontextmanager
async def _bus_as(stack: Stack, user: str) -> AsyncIterator[Bus]:
    assert stack.context is not None
    bus = await Bus.connect(stack.context.nats_url, NS, ca=stack.context.nats_ca,
                            credentials=str(stack.options.data_dir / "credentials" / f"{user}.json"))
    try:
        yield bus
    finally:
        await bus.close()


async def _refused(bus: Bus, subject: str, event: ev.Event) -> bool:
    """True when the server refuses the publish (a permissions violation, or no stream ack)."""
    return await refused(bus, subject, bus.publish(subject, encode(event), event.event_id, timeout=1.5))


def _spec(**kw: Any) -> JobSpec:
    return msgspec.convert({"name": "sec", "queue": "team-a", "replicas": 1, "gpus_per_replica": 8,
                            "runtime": "sim", "duration_seconds": 600, **kw}, JobSpec)


async def _running_job(stack: Stack, user: str | None = None) -> tuple[str, Client]:
    client = await Client.connect(_ctx(stack, user))
    job_id = await client.submit(_spec())
    await client.wait_for(lambda v: v.jobs.get(job_id) is not None and v.jobs[job_id].state.name == "RUNNING", 30)
    return job_id, client


async def test_anonymous_client_cannot_connect(secured: Stack) -> None:
    """Neither in plain TCP nor over TLS with the CA trusted: an identity is required."""
    ctx = secured.context
    assert ctx is not None and ctx.nats_ca and ctx.nats_url.startswith("tls://")
    attempts: list[dict[str, Any]] = [
        {}, {"tls": ssl.create_default_context(cafile=ctx.nats_ca), "tls_handshake_first": True}]
    for kw in attempts:
        with pytest.raises(Exception):  # noqa: B017 - any refusal: auth violation, TLS, or no servers
            nc = await nats.connect(ctx.nats_url, allow_reconnect=False, max_reconnect_attempts=0,
                                    connect_timeout=2, **kw)
            await nc.close()
    # the same TLS client with the admin's identity connects: the refusal above is for the identity
    async with await Bus.connect(ctx.nats_url, NS, credentials=ctx.credentials, ca=ctx.nats_ca) as bus:
        await bus.nc.flush(timeout=5)


@pytest.mark.parametrize("who", ["agent", "bob"])
async def test_forged_gang_reserved_starts_nothing(secured: Stack, who: str) -> None:
    """The RCE: a JobSubmitted then a GangReserved published on the events subjects."""
    user = _agent_user(secured) if who == "agent" else who
    job_id = "jforged" + secrets.token_hex(4)
    spec = _spec(runtime="process", command=["sh", "-c", "id > /tmp/corral-pwned"])
    subjects = Subjects(NS)
    async with _bus_as(secured, user) as bus:
        submitted = ev.JobSubmitted.new(stream=job_stream(job_id), actor="user/x", job_id=job_id, spec=spec)
        reserved = ev.GangReserved.new(stream=job_stream(job_id), actor="placement", job_id=job_id,
                                       ranks=[ev.RankPlacement(rank=0, node="node-0", gpus=[0, 1])],
                                       world_size=1, master_addr="127.0.0.1", master_port=29500)
        assert await _refused(bus, subjects.event("JobSubmitted"), submitted)
        assert await _refused(bus, subjects.event("GangReserved"), reserved)
    async with await Client.connect(_ctx(secured, None)) as reader:
        await handled(reader.bus)
        assert job_id not in (await reader.view()).jobs


@pytest.mark.parametrize("forged", ["WorkerExited", "CheckpointDone", "PreemptRequested", "GangReleased",
                                    "JobCompleted"])
async def test_forged_events_change_nothing(secured: Stack, forged: str) -> None:
    job_id, client = await _running_job(secured)
    try:
        job = (await client.view()).jobs[job_id]
        node = job.ranks[0].node
        common: dict[str, Any] = {"stream": job_stream(job_id), "actor": "placement", "job_id": job_id}
        event: ev.Event = {
            "WorkerExited": lambda: ev.WorkerExited.new(**common, rank=0, node=node, exit_code=0, attempt=job.attempt,
                                                        reason=Reason(code="COMPLETED", message="forged")),
            "CheckpointDone": lambda: ev.CheckpointDone.new(**common, path="/etc/shadow", rank=0, attempt=job.attempt),
            "PreemptRequested": lambda: ev.PreemptRequested.new(
                stream=job_stream(job_id), actor="preemption", victim_job_id=job_id, for_job_id=job_id,
                deadline=datetime.now(UTC), signal="SIGKILL", reason=Reason(code="PREEMPTED", message="forged")),
            "GangReleased": lambda: ev.GangReleased.new(**common, attempt=job.attempt,
                                                        reason=Reason(code="PREEMPTED", message="forged")),
            "JobCompleted": lambda: ev.JobCompleted.new(**common),
        }[forged]()
        async with _bus_as(secured, _agent_user(secured)) as bus:
            assert await _refused(bus, Subjects(NS).event(forged), event)
            if forged in ("WorkerExited", "CheckpointDone"):
                # The same report, on the agent's own inbox subject, from a node without this gang.
                other = "node-1" if node == "node-0" else "node-0"
                if isinstance(event, ev.WorkerExited):
                    event = msgspec.structs.replace(event, node=other)
                event = msgspec.structs.replace(event, actor=f"node-agent/{other}")
                assert not await _refused(bus, Subjects(NS).node_report(other, forged), event)
        await handled(client.bus)  # the report taken by its consumer and what it led to, if anything
        after = (await client.view()).jobs[job_id]
        assert after.state.name == "RUNNING", after
        assert after.attempt == job.attempt
        assert getattr(after, "checkpoint", None) in (None, getattr(job, "checkpoint", None))
    finally:
        await client.cancel(job_id)
        await client.close()


async def test_node_cannot_report_as_another_node(secured: Stack) -> None:
    """A node identity publishes only its own nodes' reports and heartbeats."""
    async with _bus_as(secured, _agent_user(secured)) as bus:
        job = ev.WorkerExited.new(stream=job_stream("jx"), actor="node-agent/evil", job_id="jx", rank=0, node="evil",
                                  exit_code=0, reason=Reason(code="COMPLETED", message="forged"))
        assert await _refused(bus, Subjects(NS).node_report("evil", "WorkerExited"), job)
        assert await _refused(bus, Subjects(NS).inbox("WorkerExited"), job)
        # A fake node registering (it held a job STARTING for 84 s on the open bus), on its own
        # subject or the bare one; and a node-0 registration naming the fake node on node-0's subject.
        fake = ev.NodeRegistered.new(stream="node-evil", actor="node-agent/evil", node="evil", gpus=[],
                                     nvlink_domains=[], rack="r", zone="z")
        assert await _refused(bus, Subjects(NS).node_report("evil", "NodeRegistered"), fake)
        assert await _refused(bus, Subjects(NS).inbox("NodeRegistered"), fake)
        assert not await _refused(bus, Subjects(NS).node_report("node-0", "NodeRegistered"), fake)
    async with await Client.connect(_ctx(secured, None)) as reader:
        await handled(reader.bus)
        assert "evil" not in (await reader.view()).nodes


async def test_submit_as_another_user_is_recorded_as_the_sender(secured: Stack) -> None:
    async with await Client.connect(_ctx(secured, "bob")) as bob:
        job_id = await bob.submit(_spec(user="alice"))  # the spec's user is a label, not an identity
        await bob.wait_for(lambda v: job_id in v.jobs, 20)
        assert (await bob.view()).jobs[job_id].user == "bob"
        forged = ev.JobSubmitted.new(stream=job_stream("jalice"), actor="user/alice", job_id="jalice",
                                     spec=_spec(), user="alice")
        assert await _refused(bob.bus, Subjects(NS).user_request("alice", "JobSubmitted"), forged)
        assert await _refused(bob.bus, Subjects(NS).inbox("JobSubmitted"), forged)
        await bob.cancel(job_id)


async def test_cancel_another_users_job_is_denied(secured: Stack) -> None:
    job_id, admin = await _running_job(secured, user=None)  # submitted by the admin (`corral up`'s user)
    try:
        async with await Client.connect(_ctx(secured, "bob")) as bob:
            await bob.cancel(job_id)
            events = [e for _, e in await admin.events() if isinstance(e, ev.AccessDenied) and e.job_id == job_id]
            for _ in range(40):
                if events:
                    break
                await asyncio.sleep(0.25)
                events = [e for _, e in await admin.events() if isinstance(e, ev.AccessDenied) and e.job_id == job_id]
            assert events and events[0].user == "bob" and events[0].reason.code == "NOT_OWNER", events
        assert (await admin.view()).jobs[job_id].state.name == "RUNNING"
    finally:
        await admin.cancel(job_id)
        await admin.close()


async def test_a_requeue_of_another_users_job_is_answered_with_the_refusal(secured: Stack) -> None:
    """`corral requeue` (and hold) waited for the job's state to move: bob's refused request
    waited 15 s and then asked whether admission was running. The refusal names the request."""
    job_id, admin = await _running_job(secured, user=None)
    try:
        async with await Client.connect(_ctx(secured, "bob")) as bob:
            verdict = await bob.await_verdict(await bob.requeue(job_id, message="mine now"), 15)
            assert isinstance(verdict.event, ev.AccessDenied) and verdict.reason is not None, verdict
            assert verdict.refused and verdict.reason.code == "NOT_OWNER", verdict
        assert (await admin.view()).jobs[job_id].attempt == 0
    finally:
        await admin.cancel(job_id)
        await admin.close()


async def test_apply_queues_as_non_admin_is_refused(secured: Stack) -> None:
    async with await Client.connect(_ctx(secured, "bob")) as bob:
        queue = validate_queues({"queues": [{"name": "bobs", "guaranteed_gpus": 16}]}).resolved()[0]
        configured = ev.QueueConfigured.new(stream="queue-bobs", actor="user/bob", queue=queue)
        assert await _refused(bob.bus, Subjects(NS).inbox("QueueConfigured"), configured)


async def test_submit_to_a_queue_not_listing_you_is_rejected(secured: Stack) -> None:
    async with await Client.connect(_ctx(secured, None)) as admin:
        await admin.apply_queues(validate_queues({"queues": [{"name": "private", "guaranteed_gpus": 0,
                                                               "submitters": ["carol"]}]}))
        await admin.wait_for(lambda v: "private" in v.queues, 20)
    async with await Client.connect(_ctx(secured, "bob")) as bob:
        job_id = await bob.submit(_spec(queue="private"))
        view = await bob.wait_for(lambda v: job_id in v.jobs and v.jobs[job_id].state.terminal, 20)
        assert view is not None
        rejected = [e for _, e in await bob.events() if isinstance(e, ev.JobRejected) and e.job_id == job_id]
        assert rejected and rejected[0].reason.code == "ACCESS_DENIED_QUEUE", rejected


# ---- Postgres: each process its own login, none a superuser ----------------------------------

SERVICE_ATTACKS = [
    "UPDATE events SET data = '{\"user\": \"mallory\"}'::json",
    "DELETE FROM events",
    "TRUNCATE events",
    "SET session_replication_role = replica",
    "ALTER TABLE events DISABLE TRIGGER USER",
    "ALTER TABLE events DISABLE TRIGGER events_no_update_or_delete",
    "COPY (SELECT 1) TO PROGRAM 'id'",
    "DELETE FROM allocations",
    "CREATE TABLE stash (x int)",
]


def _service_dsn(stack: Stack, name: str) -> str:
    return stack.process(name).env["CORRAL_POSTGRES_DSN"]


async def test_each_service_connects_with_its_own_login_and_none_as_a_superuser(secured: Stack) -> None:
    assert "CORRAL_POSTGRES_DSN" not in secured.process("node-agents").env  # the agents never need it
    dsns = {p.name: _service_dsn(secured, p.name) for p in secured.processes if p.name != "node-agents"}
    assert "passfile=" in dsns["admission"] and ":" not in dsns["admission"].split("@")[0].split("//")[1]
    conn = await asyncpg.connect(secured.context.postgres_dsn)  # type: ignore[union-attr]
    try:
        logins = {r["usename"]: r["rolsuper"] for r in await conn.fetch(
            "SELECT DISTINCT a.usename, r.rolsuper FROM pg_stat_activity a JOIN pg_roles r ON r.oid = a.usesysid "
            "WHERE a.datname = current_database()")}
        database = await conn.fetchval("SELECT current_database()")
    finally:
        await conn.close()
    services = {f"{database}_svc_{name}" for name in ("admission", "quota", "placement", "preemption")}
    assert services <= set(logins), logins  # every service is connected, each with its login
    assert set(logins) <= services | {f"{database}_cli"}, logins  # nobody else (no `postgres`)
    assert not any(logins.values()), logins


@pytest.mark.parametrize("sql", SERVICE_ATTACKS)
async def test_a_service_login_cannot_rewrite_the_log(secured: Stack, sql: str) -> None:
    conn = await asyncpg.connect(_service_dsn(secured, "placement"))
    try:
        assert await conn.fetchval("SELECT count(*) FROM events") > 0  # it reads the log
        with pytest.raises(asyncpg.PostgresError) as refused:
            await conn.execute(sql)
        assert isinstance(refused.value, asyncpg.InsufficientPrivilegeError), repr(refused.value)
    finally:
        await conn.close()


async def test_the_cli_login_only_reads(secured: Stack) -> None:
    conn = await asyncpg.connect(secured.context.postgres_dsn)  # type: ignore[union-attr]
    try:
        assert await conn.fetchval("SELECT count(*) FROM events") > 0
        for sql in ("INSERT INTO relay_positions VALUES ('x', 1)", "UPDATE consumer_checkpoints SET position = 0",
                    "SELECT position FROM event_log_head FOR UPDATE",  # what every append takes first
                    "INSERT INTO events (stream, version, position, event_id, type, schema_version, data, "
                    "occurred_at) VALUES ('job-x', 1, 1000000, 'x', 'JobSubmitted', 1, '{}', now())"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(sql)
    finally:
        await conn.close()


async def _api(bus: Bus, subject: str, body: dict[str, Any]) -> dict[str, Any] | None:
    """A JetStream API request; None when the server refuses the publish (no reply comes)."""
    replies: list[Any] = []

    async def ask() -> None:
        replies.append(await bus.nc.request(subject, json.dumps(body).encode(), timeout=1.0))

    if await refused(bus, subject, ask()):
        return None
    answer: dict[str, Any] = json.loads(replies[0].data)
    return answer


async def test_an_agent_cannot_create_pull_or_redefine_another_durable(secured: Stack) -> None:
    """A stolen agent credential: JetStream calls on any consumer but its own two (its durable and
    its history consumer) are refused; naming another durable in the body of its own create is
    refused by the server; the other durable keeps its configuration."""
    events = "CORRAL_EVENTS"
    agent_user = _agent_user(secured)
    durable = agent_user.removeprefix("agent-")
    async with await Client.connect(_ctx(secured, None)) as admin:
        victims = [c for c in await admin.bus.js.consumers_info(events)
                   if c.name not in (durable, history_consumer(durable)) and c.config.durable_name]
        assert victims, "the services' durables of the events stream"
        victim = victims[0]
        async with _bus_as(secured, agent_user) as bus:
            redefine = {"deliver_policy": "all", "ack_policy": "explicit", "filter_subject": f"{NS}.events.Nothing",
                        "description": "hijacked"}
            attempts = [
                # legacy (nameless) create naming the victim in its body: it would redefine it
                ("$JS.API.CONSUMER.CREATE." + events, {"name": victim.name, **redefine}),
                (f"$JS.API.CONSUMER.CREATE.{events}.{victim.name}", {"name": victim.name, **redefine}),
                (f"$JS.API.CONSUMER.CREATE.{events}.{victim.name}.{NS}.events.Nothing",
                 {"name": victim.name, **redefine}),
                (f"$JS.API.CONSUMER.DURABLE.CREATE.{events}.{victim.name}", {"durable_name": victim.name, **redefine}),
                (f"$JS.API.CONSUMER.CREATE.{events}.somebody-new", {"name": "somebody-new", **redefine}),
            ]
            for subject, config in attempts:
                assert await _api(bus, subject, {"stream_name": events, "config": config}) is None, subject
            for subject in (f"$JS.API.CONSUMER.MSG.NEXT.{events}.{victim.name}",
                            f"$JS.API.CONSUMER.INFO.{events}.{victim.name}",
                            f"$JS.API.CONSUMER.DELETE.{events}.{victim.name}",
                            f"$JS.API.CONSUMER.DELETE.{events}.{durable}"):
                assert await _api(bus, subject, {"batch": 1, "expires": 500_000_000}) is None, subject
            # Its own subjects, the victim's name in the body: the server refuses the mismatch.
            for own in (durable, history_consumer(durable)):
                answer = await _api(bus, f"$JS.API.CONSUMER.CREATE.{events}.{own}",
                                    {"stream_name": events, "config": {"durable_name": victim.name, **redefine}})
                assert answer is not None and "error" in answer, answer
        after = await admin.bus.js.consumer_info(events, victim.name)
        assert after.config.filter_subject == victim.config.filter_subject
        assert after.config.filter_subjects == victim.config.filter_subjects
        assert after.config.description == victim.config.description
    # The agent's own history read still works with these rights (it read the past at start).
    log = (secured.options.data_dir / "logs" / "node-agents.log").read_text()
    assert "could not read past job specs" not in log and "past event(s)" in log, log[-2000:]


async def test_log_lines_come_only_from_the_node_that_ran_the_rank_and_only_an_admin_reads_them(
        secured: Stack) -> None:
    """Ranks' output on the bus (`corral.contracts.logs`): a node publishes only its own nodes'
    log subjects (a forged chunk of another node is refused by the server), a submitter publishes
    none, and reading the log stream takes the admin's login."""
    from corral.contracts.logs import LogChunk, encode_chunk, log_subject
    from corral.log_stream import LogQuery, LogStreamUnavailable, read_chunks

    job_id, client = await _running_job(secured)
    try:
        chunks: list[LogChunk] = []
        for _ in range(30):  # the admin (this context's login) reads the stream
            chunks = []
            await read_chunks(client.bus, LogQuery(job_id), chunks.append)
            if any("sim rank=0" in line for c in chunks for line in c.lines):
                break
            await asyncio.sleep(0.5)
        assert any("sim rank=0" in line for c in chunks for line in c.lines), chunks
        mine = next(iter(chunks)).node

        def chunk(node: str) -> tuple[str, bytes, str]:
            forged = LogChunk(job_id=job_id, attempt=0, node=node, rank=0, offset=10**9, end=10**9,
                              lines=["forged"])
            return log_subject(NS, job_id, 0, node, 0), encode_chunk(forged), f"forged-{node}-{secrets.token_hex(4)}"

        async with _bus_as(secured, _agent_user(secured)) as agent:
            for node in ("evil", "node-9"):
                subject, data, msg_id = chunk(node)
                assert await refused(agent, subject, agent.publish(subject, data, msg_id, timeout=1.0))
            subject, data, msg_id = chunk(mine)
            await agent.publish(subject, data, msg_id, timeout=5.0)  # its own node: taken
        async with _bus_as(secured, "bob") as bob:
            subject, data, msg_id = chunk(mine)
            assert await refused(bob, subject, bob.publish(subject, data, msg_id, timeout=1.0))
            with pytest.raises(LogStreamUnavailable, match="admin"):
                await read_chunks(bob, LogQuery(job_id), lambda _: None, timeout=1.0)
    finally:
        await client.cancel(job_id)
        await client.close()
