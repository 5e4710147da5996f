"""People and pipelines as principals: `corral user add|list|remove|rotate` and `corral whoami`.

One stack for the module, as `corral up` runs it (its own nats-server with TLS and identities,
per-service Postgres logins on a fresh database of the session's server). The admin is the
operator: the CLI given the data folder as its context. Each person gets a context file of their
own (`--out`), and the CLI given it acts as that person, whatever `$USER` says. Adding, removing
and rotating never restarts the bus: the nats-server's pid stays the same, and a removed or
rotated credential's open connection is closed by the server's config reload.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import nats
import pytest

from corral.client import Client
from corral.contracts import events as ev
from corral.contracts.registry import decode
from corral.stack.context import Context
from corral.stack.credentials import admin_name
from corral.stack.up import Stack
from tests.e2e.conftest import own_site

NS = "corral"


@pytest.fixture(scope="module")
async def site(postgres_server_dsn: str) -> AsyncIterator[Stack]:
    """`corral up` with its own NATS (identities, TLS) and Postgres logins: 2 nodes x 8 GPUs."""
    async with own_site(postgres_server_dsn, "corral-people-", write_user_context=False) as stack:
        yield stack


def corral(*args: str, context: Path | str, user: str | None = None,
           check: bool = True) -> subprocess.CompletedProcess[str]:
    """The CLI as a person runs it: only a context (no cluster variables), `$USER` as given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update({"COLUMNS": "200", "PYTHONUNBUFFERED": "1", "CORRAL_CONTEXT": str(context)})
    if user is not None:
        env["USER"] = user
    proc = subprocess.run([sys.executable, "-m", "corral.cli.main", *args], text=True, capture_output=True,
                          env=env, timeout=150)
    if check and proc.returncode != 0:
        raise AssertionError(f"corral {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def admin(stack: Stack, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """The operator: the CLI given `corral up`'s data folder."""
    return corral(*args, context=stack.options.data_dir, check=check)


def job_file(folder: Path, name: str, *, seconds: float = 1.0, extra: str = "", queue: str = "team-a") -> str:
    path = folder / f"{name}.yaml"
    path.write_text(f"name: {name}\nqueue: {queue}\nreplicas: 1\ngpus_per_replica: 1\nruntime: sim\n"
                    f"duration_seconds: {seconds}\n{extra}")
    return str(path)


def nats_pid(stack: Stack) -> int:
    assert stack.nats is not None and stack.nats.proc is not None
    return stack.nats.proc.pid


async def connect_raw(context_file: Path, **kw: Any) -> Any:
    """A plain nats-py connection with the identity and CA of a person's context file."""
    ctx = json.loads(context_file.read_text())
    tls = ssl.create_default_context(cadata=ctx["nats_ca_pem"])
    return await nats.connect(ctx["nats_url"], user=ctx["nats_identity"]["user"],
                              password=ctx["nats_identity"]["password"], tls=tls, tls_handshake_first=True,
                              allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=3, **kw)


async def refused(context_file: Path) -> bool:
    try:
        nc = await connect_raw(context_file)
    except Exception:
        return True
    await nc.close()
    return False


async def test_a_person_added_by_the_admin_acts_under_her_own_name(site: Stack, tmp_path: Path) -> None:
    """Problem 1: everyone shared the admin's login and was recorded as `$USER` said. Now the admin
    adds alice; the CLI with alice's context submits as alice (even with USER=bob), and `corral
    usage --by user` tells her from the admin."""
    pid = nats_pid(site)
    alice = tmp_path / "alice.json"
    added = admin(site, "user", "add", "alice", "--out", str(alice), "--json")
    assert json.loads(added.stdout)["name"] == "alice"
    assert alice.stat().st_mode & 0o777 == 0o600
    saved = json.loads(alice.read_text())
    assert saved["nats_identity"]["user"] == "alice" and "BEGIN CERTIFICATE" in saved["nats_ca_pem"]
    assert saved["postgres_dsn"].startswith("postgresql://") and "_u_alice@" in saved["postgres_dsn"]
    assert saved["postgres_password"] not in saved["postgres_dsn"]

    me = json.loads(corral("whoami", "--json", context=alice, user="bob").stdout)
    assert me["user"] == "alice" and me["kind"] == "person" and me["source"] == str(alice)

    done = json.loads(corral("submit", job_file(tmp_path, "hers"), "--wait", "--until-done", "--json",
                             context=alice, user="bob").stdout)
    assert done["state"] == "COMPLETED" and done["user"] == "alice"
    mine = json.loads(admin(site, "submit", job_file(tmp_path, "ops"), "--wait", "--until-done", "--json").stdout)
    assert mine["user"] == admin_name()

    async with await Client.connect(site.context) as client:  # type: ignore[arg-type]
        trail = await client.job_events(done["id"])
        people = [decode(s.data) for s in await client.store.read_stream("people")]
    added_alice = [e for e in people if isinstance(e, ev.UserAdded) and e.user == "alice"]
    assert len(added_alice) == 1 and added_alice[0].kind == "person"
    assert added_alice[0].actor == f"admin/{admin_name()}"  # the admin acts as the admin
    submitted = next(e for _, e in trail if isinstance(e, ev.JobSubmitted))
    assert submitted.user == "alice" and submitted.actor == "user/alice"

    usage = json.loads(corral("usage", "--by", "user", "--json", context=alice).stdout)
    users = {row["user"] for row in usage["rows"]}
    assert {"alice", admin_name()} <= users and "bob" not in users

    listed = json.loads(admin(site, "user", "list", "--json").stdout)
    kinds = {p["name"]: p["kind"] for p in listed}
    assert kinds["alice"] == "person" and kinds[admin_name()] == "admin"
    assert nats_pid(site) == pid  # the bus never restarted


async def test_only_the_operator_manages_people(site: Stack, tmp_path: Path) -> None:
    """A person's context cannot add anyone: `corral user` needs the installation's data folder."""
    eve = tmp_path / "eve.json"
    admin(site, "user", "add", "eve", "--out", str(eve))
    proc = corral("user", "add", "mallory", context=eve, check=False)
    assert proc.returncode != 0 and "data folder" in proc.stderr
    assert "mallory" not in {p["name"] for p in json.loads(admin(site, "user", "list", "--json").stdout)}
    bad = admin(site, "user", "add", "svc-admission", check=False)
    assert bad.returncode != 0 and "svc-admission" in bad.stderr
    myself = admin(site, "user", "remove", admin_name(), check=False)
    assert myself.returncode != 0 and "operator" in myself.stderr


async def test_remove_closes_open_connections_and_keeps_jobs(site: Stack, tmp_path: Path) -> None:
    """`corral user remove`: the credential stops working at once (the open connection is closed by
    the reload, a new one refused, the Postgres login too); the person's jobs stay."""
    pid = nats_pid(site)
    carol = tmp_path / "carol.json"
    admin(site, "user", "add", "carol", "--out", str(carol))
    job = json.loads(corral("submit", job_file(tmp_path, "carols", seconds=600), "--json", context=carol).stdout)
    closed = asyncio.Event()

    async def on_closed() -> None:
        closed.set()

    nc = await connect_raw(carol, closed_cb=on_closed)
    try:
        admin(site, "user", "remove", "carol")
        await asyncio.wait_for(closed.wait(), 20)
    finally:
        await nc.close()
    assert await refused(carol)
    saved = json.loads(carol.read_text())
    with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError):
        await asyncpg.connect(saved["postgres_dsn"], password=saved["postgres_password"])
    assert corral("jobs", context=carol, check=False).returncode != 0
    shown = json.loads(admin(site, "show", job["id"], "--json").stdout)
    assert shown["id"] == job["id"] and shown["user"] == "carol"
    assert "carol" not in {p["name"] for p in json.loads(admin(site, "user", "list", "--json").stdout)}
    admin(site, "cancel", job["id"])
    assert nats_pid(site) == pid
    async with await Client.connect(site.context) as client:  # type: ignore[arg-type]
        people = [decode(s.data) for s in await client.store.read_stream("people")]
    assert [type(e).__name__ for e in people if getattr(e, "user", None) == "carol"] == ["UserAdded", "UserRemoved"]


async def test_rotate_refuses_the_old_secret(site: Stack, tmp_path: Path) -> None:
    pid = nats_pid(site)
    old, new = tmp_path / "dave-old.json", tmp_path / "dave.json"
    admin(site, "user", "add", "dave", "--out", str(old))
    closed = asyncio.Event()

    async def on_closed() -> None:
        closed.set()

    nc = await connect_raw(old, closed_cb=on_closed)
    try:
        admin(site, "user", "rotate", "dave", "--out", str(new))
        await asyncio.wait_for(closed.wait(), 20)
    finally:
        await nc.close()
    assert await refused(old)
    assert not await refused(new)
    assert json.loads(corral("whoami", "--json", context=new).stdout)["user"] == "dave"
    assert corral("jobs", context=new).returncode == 0
    assert nats_pid(site) == pid


async def test_a_pipeline_submits_idempotently_and_waits_for_the_outcome(site: Stack, tmp_path: Path) -> None:
    ci = tmp_path / "ci.json"
    admin(site, "user", "add", "ci-nightly", "--pipeline", "--out", str(ci))
    spec = job_file(tmp_path, "nightly", extra="submission_id: nightly-2026-12-07\n")
    first = json.loads(corral("submit", spec, "--wait", "--until-done", "--json", context=ci).stdout)
    again = json.loads(corral("submit", spec, "--json", context=ci).stdout)
    assert first["state"] == "COMPLETED" and first["user"] == "ci-nightly"
    assert again["id"] == first["id"]
    me = json.loads(corral("whoami", "--json", context=ci).stdout)
    assert me == {**me, "user": "ci-nightly", "kind": "pipeline"}


async def test_three_people_and_a_pipeline_may_do_only_their_own_jobs(site: Stack, tmp_path: Path) -> None:
    """The matrix of docs/security.md with people made by `corral user add`: alice, bob and the
    pipeline ci each submit, read and follow their own jobs; every forbidden act (another user's
    subject, a node's report, a bare inbox subject, a reused submission id, a cancel of another's
    job, reading another's env or logs, applying queues) is refused with nothing recorded in the
    other's name; a limit stops alice and not bob; `corral usage --by user` tells them apart."""
    from corral.bus import Bus
    from corral.contracts.envelope import Reason
    from corral.contracts.jobspec import validate_job_spec
    from corral.contracts.subjects import Subjects
    from tests.e2e.test_security import _refused

    ctx = {name: tmp_path / f"{name}.json" for name in ("amy", "ben", "ci-matrix")}
    admin(site, "user", "add", "amy", "--out", str(ctx["amy"]))
    admin(site, "user", "add", "ben", "--out", str(ctx["ben"]))
    admin(site, "user", "add", "ci-matrix", "--pipeline", "--out", str(ctx["ci-matrix"]))
    amy, ben, ci = ctx["amy"], ctx["ben"], ctx["ci-matrix"]
    queues = tmp_path / "queues.yaml"
    queues.write_text("queues:\n  - name: team-a\n    guaranteed_gpus: 16\n"
                      "  - name: limited\n    guaranteed_gpus: 0\n    max_submitted_per_user: 2\n")
    refused_apply = corral("apply", str(queues), context=amy, check=False)
    assert refused_apply.returncode != 0 and "admin" in refused_apply.stderr, refused_apply
    admin(site, "apply", str(queues))

    # each submits and follows their own job to its end, under their own name (whatever $USER says)
    for who, path in ctx.items():
        done = json.loads(corral("submit", job_file(tmp_path, f"own-{who}"), "--wait", "--until-done", "--json",
                                 context=path, user="root").stdout)
        assert done["state"] == "COMPLETED" and done["user"] == who, done
        assert corral("logs", done["id"], context=path).returncode == 0
    usage = json.loads(corral("usage", "--by", "user", "--json", context=ci).stdout)
    assert set(ctx) <= {row["user"] for row in usage["rows"]}

    # ben's job, with a secret in its env: amy may neither cancel it nor read its env or its logs
    bens = json.loads(corral("submit", job_file(tmp_path, "bens", seconds=600, extra="env: {API_TOKEN: ben-s3cret}\n"),
                             "--json", context=ben).stdout)["id"]
    cancel = corral("cancel", bens, context=amy, check=False)
    assert cancel.returncode != 0 and "NOT_OWNER" in cancel.stdout + cancel.stderr, cancel
    assert "ben-s3cret" not in corral("show", bens, "--json", context=amy).stdout
    assert "ben-s3cret" in corral("show", bens, "--json", context=ben).stdout
    assert corral("logs", bens, context=amy, check=False).returncode != 0

    # the same submission id from amy and ben: two jobs, each its owner's
    same = "submission_id: nightly-2026-12-07\n"
    hers = json.loads(corral("submit", job_file(tmp_path, "dup-a", extra=same), "--json", context=amy).stdout)
    his = json.loads(corral("submit", job_file(tmp_path, "dup-b", extra=same), "--json", context=ben).stdout)
    assert hers["id"] != his["id"], (hers, his)

    # amy's credential on ben's subject, on a node's report subject, on the bare inbox: refused
    subjects = Subjects(NS)
    saved = json.loads(amy.read_text())
    spec = validate_job_spec({"name": "forged", "queue": "team-a", "gpus_per_replica": 1, "runtime": "sim",
                              "duration_seconds": 1})
    forged = ev.JobSubmitted.new(stream="job-jforged", actor="user/ben", job_id="jforged", spec=spec, user="ben")
    exited = ev.WorkerExited.new(stream=f"job-{bens}", actor="node-agent/node-0", job_id=bens, rank=0,
                                 node="node-0", exit_code=0, reason=Reason(code="COMPLETED", message="forged"))
    async with await Bus.connect(saved["nats_url"], NS, credentials=str(amy), ca=saved["nats_ca_pem"]) as bus:
        assert await _refused(bus, subjects.user_request("ben", "JobSubmitted"), forged)
        assert await _refused(bus, subjects.node_report("node-0", "WorkerExited"), exited)
        assert await _refused(bus, f"{NS}.inbox.JobSubmitted", forged)

    # a limit stops amy, not ben
    for i in range(2):
        corral("submit", job_file(tmp_path, f"lim-{i}", seconds=600, queue="limited"), "--json", context=amy)
    over = corral("submit", job_file(tmp_path, "lim-2", seconds=600, queue="limited"), "--json", context=amy,
                  check=False)
    assert over.returncode != 0 and "LIMIT_SUBMITTED" in over.stdout + over.stderr, over
    corral("submit", job_file(tmp_path, "lim-b", seconds=600, queue="limited"), "--json", context=ben)

    async with await Client.connect(site.context) as client:  # type: ignore[arg-type]
        view = await client.view()
        trail = [e for _, e in await client.job_events(bens)]
    assert "jforged" not in view.jobs and view.jobs[bens].state.name != "COMPLETED"
    assert all(e.user == "amy" for e in trail if isinstance(e, ev.AccessDenied))
    assert not any(isinstance(e, ev.JobCancelled) for e in trail)
    for job in [j for j in view.jobs.values() if j.user in ctx and j.state.name not in ("COMPLETED", "REJECTED")]:
        done = admin(site, "cancel", job.job_id, check=False)  # a short job may end after the view was read
        assert done.returncode == 0 or "nothing was done: the job is" in done.stderr, done


async def test_people_survive_a_restart_of_corral_up(site: Stack, tmp_path: Path) -> None:
    """The registry lives in the data folder: a restart keeps every person and their secret."""
    frank = tmp_path / "frank.json"
    admin(site, "user", "add", "frank", "--admin", "--out", str(frank))
    data = site.options.data_dir
    site.stop()
    site.start()
    async with await Client.connect(site.context) as client:  # type: ignore[arg-type]
        await client.wait_for(lambda v: len(v.nodes) >= 2, 30)
    assert json.loads(corral("whoami", "--json", context=frank).stdout)["kind"] == "admin"
    assert corral("jobs", context=frank).returncode == 0
    listed = {p["name"]: p["kind"] for p in json.loads(admin(site, "user", "list", "--json").stdout)}
    assert listed["frank"] == "admin" and listed["alice"] == "person"
    assert (data / "people.json").is_file()
    assert isinstance(site.context, Context)
