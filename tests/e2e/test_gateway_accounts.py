"""Two real OS accounts on one host: each `corral submit` is recorded as its account, with no
credential file of its own, and neither can submit or cancel as the other.

The stack is `corral up`'s with its own (authenticated) NATS, so it runs the local gateway
(`corral.services.gateway`); the accounts are created here with `useradd` and removed after.
Each command runs as its account (uid, gid, no supplementary group: nothing of root's) with the
public context `<data_dir>/gateway` and nothing else: the admin's credential files are 0600 in a
0700 folder, unreadable to them, so `corral` goes through the gateway, which asks the kernel who
connected (SO_PEERCRED).
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import secrets
import shutil
import site
import socket
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from corral.bus import Bus
from corral.client import Client
from corral.contracts import events as ev
from corral.contracts.envelope import Reason, job_stream
from corral.contracts.jobspec import JobSpec
from corral.contracts.registry import encode
from corral.contracts.subjects import Subjects
from corral.gateway import protocol as p
from corral.stack.up import Stack
from tests.e2e.conftest import own_site
from tests.nats_refusals import refused

NS = "corral"
VENV_BIN = Path(sys.executable).parent
#: What `corral` is, run by another account: this venv's code (its site-packages, the editable
#: install's .pth included) on a Python of this minor version that other accounts may execute
#: (the venv's own may live under a 0700 home, e.g. pyenv's under /root).
SITE_PACKAGES = next(Path(p) for p in site.getsitepackages() if p.startswith(sys.prefix))
LAUNCH = ("import site, sys; site.addsitedir(sys.argv.pop(1)); sys.argv[0] = 'corral'; "
          "from corral.cli.main import main; sys.exit(main())")


def _reachable(path: Path) -> bool:
    """Whether an account with no group of root's may open `path` (mode bits of it and its folders)."""
    path = path.resolve()
    return all(folder.stat().st_mode & stat.S_IXOTH for folder in path.parents) and bool(
        path.stat().st_mode & (stat.S_IROTH | stat.S_IXOTH))


def _python() -> str | None:
    """A Python of this minor version other accounts may run: this one, else one on the PATH."""
    minor = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, shutil.which(minor), f"/usr/bin/{minor}", f"/usr/local/bin/{minor}"):
        if candidate and Path(candidate).exists() and _reachable(Path(candidate)):
            return str(Path(candidate).resolve())
    return None


PYTHON = _python()


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "creating OS accounts takes root"
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        return "no useradd/userdel on this host"
    if PYTHON is None:
        return f"no python{sys.version_info.major}.{sys.version_info.minor} that other accounts may run"
    for path in (SITE_PACKAGES, Path(__file__).parent.parent.parent / "libs" / "corral" / "cli" / "main.py"):
        if not _reachable(path):
            return f"{path} is not readable by other accounts: they cannot run corral"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")


@pytest.fixture(scope="module")
def accounts() -> Iterator[tuple[str, str]]:
    """Two fresh OS accounts (no home, no password), removed afterwards."""
    tag = secrets.token_hex(3)
    names = (f"cga{tag}", f"cgb{tag}")
    made = []
    try:
        for name in names:
            subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", "--user-group", name],
                           check=True, capture_output=True)
            made.append(name)
        yield names
    finally:
        for name in made:
            subprocess.run(["userdel", name], capture_output=True)


@pytest.fixture(scope="module")
async def gated(postgres_server_dsn: str) -> AsyncIterator[Stack]:
    """`corral up` with its own NATS (auth and TLS on) and so its gateway; 2 nodes x 8 GPUs."""
    # 0755: mkdtemp's 0700 would keep every other account out, gateway folder included
    async with own_site(postgres_server_dsn, "corral-gw-", runtime="sim", data_mode=0o755) as stack:
        yield stack


def _as(account: str, *argv: str, stdin: str | None = None, env: dict[str, str] | None = None,
        timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run `argv` as `account`: its uid and group only, a clean environment, cwd /."""
    pw = pwd.getpwnam(account)
    return subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=timeout, cwd="/",
                          user=pw.pw_uid, group=pw.pw_gid, extra_groups=[],
                          env={"PATH": f"{VENV_BIN}:/usr/bin:/bin", "HOME": "/", "USER": account, "LOGNAME": account,
                               "COLUMNS": "200", **(env or {})})


def _corral(stack: Stack, account: str, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """`corral ARGS` as `account`, with the public context of `stack` (`<data_dir>/gateway`)."""
    public = stack.options.data_dir / "gateway"
    env = {"CORRAL_CONTEXT": str(public), **kw.pop("env", {})}
    if env.get("CORRAL_GATEWAY"):  # a login node's person: the socket and nothing else
        del env["CORRAL_CONTEXT"]
    return _as(account, str(PYTHON), "-c", LAUNCH, str(SITE_PACKAGES), *args, env=env, **kw)


def _spec_text(**extra: Any) -> str:
    return json.dumps({"name": "gw", "queue": "team-a", "replicas": 1, "gpus_per_replica": 1, "runtime": "sim",
                       "duration_seconds": 600, **extra})


def _job_id(out: str) -> str:
    # "Submitted job j0123456789abcd: admitted to queue team-a (priority 500)"
    words = out.split()
    return words[words.index("job") + 1].rstrip(":")


async def _recorded(stack: Stack, job_id: str, kind: type[ev.Event], timeout: float = 20.0) -> list[Any]:
    async with await Client.connect(stack.context, bus=False) as reader:  # type: ignore[arg-type]
        for _ in range(int(timeout / 0.2)):
            found = [e for _, e in await reader.job_events(job_id) if isinstance(e, kind)]
            if found:
                return found
            await asyncio.sleep(0.2)
    return []


async def _events(stack: Stack, job_id: str) -> list[ev.Event]:
    async with await Client.connect(stack.context, bus=False) as reader:  # type: ignore[arg-type]
        return [e for _, e in await reader.job_events(job_id)]


async def test_no_account_can_read_a_credential_and_the_gateway_is_open_to_all(gated: Stack,
                                                                                accounts: tuple[str, str]) -> None:
    a, _ = accounts
    keys = gated.options.data_dir / "credentials"
    for secret in (keys / "gateway.json", keys / "svc-admission.json", keys / "pg-cli.pgpass"):
        seen = _as(a, "cat", str(secret))
        assert seen.returncode != 0 and "Permission denied" in seen.stderr, (secret, seen)
    public = gated.options.data_dir / "gateway"
    sock = public / "gateway.sock"
    assert stat.S_ISSOCK(sock.stat().st_mode) and stat.S_IMODE(sock.stat().st_mode) == 0o666
    ctx = json.loads((public / "context.json").read_text())
    assert ctx["gateway"] == str(sock) and ctx["credentials"] is None
    assert stat.S_IMODE((public / "context.json").stat().st_mode) == 0o644
    assert ctx.get("nats_identity") is None and ctx.get("postgres_password") is None  # no secret in it
    me = _corral(gated, a, "whoami")
    assert me.returncode == 0 and f"{a} (unix account, via gateway {sock})" in me.stdout.replace("\n", ""), me


async def test_each_account_submits_as_itself_whatever_it_claims(gated: Stack, accounts: tuple[str, str]) -> None:
    a, b = accounts
    # A claims to be B every way a client can: $USER, the spec's `user`, the admin's context and
    # credential file (unreadable to A)
    tries = [
        _corral(gated, a, "submit", "-", stdin=_spec_text(user=b), env={"USER": b, "LOGNAME": b}),
        _corral(gated, a, "--context", str(gated.options.data_dir), "submit", "-", stdin=_spec_text(),
                env={"CORRAL_CREDENTIALS": str(gated.context.credentials)}),  # type: ignore[union-attr]
        _corral(gated, b, "submit", "-", stdin=_spec_text(), env={"USER": a}),
        _corral(gated, b, "submit", "-", stdin=_spec_text(),
                env={"CORRAL_GATEWAY": str(gated.options.data_dir / "gateway" / "gateway.sock")}),
    ]
    owners = [a, a, b, b]
    jobs = []
    for done in tries:
        assert done.returncode == 0, done.stderr
        assert "admitted to queue team-a" in done.stdout, done.stdout
        jobs.append(_job_id(done.stdout))
    assert len(set(jobs)) == 4
    for job_id, owner in zip(jobs, owners, strict=True):
        submitted = (await _recorded(gated, job_id, ev.JobSubmitted))[0]
        assert (submitted.user, submitted.actor) == (owner, f"user/{owner}"), (job_id, submitted.user)
    # `corral jobs` through the gateway lists them, by their owners
    listed = _corral(gated, b, "jobs", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["id"]: r for r in json.loads(listed.stdout)}
    assert {rows[j]["user"] for j in jobs} == {a, b}
    for job_id in jobs:
        assert _corral(gated, b if job_id in jobs[2:] else a, "cancel", job_id).returncode == 0


async def test_one_account_cannot_cancel_anothers_job(gated: Stack, accounts: tuple[str, str]) -> None:
    a, b = accounts
    made = _corral(gated, b, "submit", "-", stdin=_spec_text())
    assert made.returncode == 0, made.stderr
    job_id = _job_id(made.stdout)
    refused = _corral(gated, a, "cancel", job_id, env={"USER": b})
    assert refused.returncode == 4 and "NOT_OWNER" in refused.stderr, (refused.stdout, refused.stderr)
    denied = await _recorded(gated, job_id, ev.AccessDenied)
    assert denied and denied[0].user == a and denied[0].reason.code == "NOT_OWNER", denied
    events = await _events(gated, job_id)
    assert not any(isinstance(e, ev.JobCancelled | ev.JobCancelRequested) for e in events), events
    assert all(e.actor != f"user/{a}" for e in events if not isinstance(e, ev.AccessDenied)), events
    # its owner may
    own = _corral(gated, b, "cancel", job_id)
    assert own.returncode == 0, own.stderr
    cancelled = await _recorded(gated, job_id, ev.JobCancelled)
    assert cancelled, await _events(gated, job_id)


async def test_submit_wait_follows_the_job_through_the_gateway(gated: Stack, accounts: tuple[str, str]) -> None:
    a, _ = accounts
    done = _corral(gated, a, "submit", "-", "--wait", stdin=_spec_text(env={"TOKEN": "alice-only"}))
    assert done.returncode == 0, done.stderr
    assert "RUNNING" in done.stdout, done.stdout
    job_id = done.stdout.split(":")[0].strip()  # "j0123456789abcd: PENDING" then "...: RUNNING"
    shown = _corral(gated, a, "show", job_id)
    assert shown.returncode == 0 and "RUNNING" in shown.stdout, shown.stdout
    logs = _corral(gated, a, "logs", job_id)  # not carried by the gateway: one clear note, no trace
    assert "through the local gateway" in logs.stderr and "Traceback" not in logs.stderr, logs.stderr
    assert _corral(gated, a, "cancel", job_id).returncode == 0


async def test_a_raw_client_cannot_pass_as_another_account(gated: Stack, accounts: tuple[str, str]) -> None:
    """Speaking the protocol directly: the user, actor and message id are the gateway's."""
    a, b = accounts
    spec = msgspec.convert(json.loads(_spec_text()), JobSpec)
    job_id = "jraw" + secrets.token_hex(5)
    forged = ev.JobSubmitted.new(stream=job_stream(job_id), actor=f"user/{b}", job_id=job_id, spec=spec, user=b,
                                 correlation_id=job_id)
    sock = str(gated.options.data_dir / "gateway" / "gateway.sock")
    script = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
        "s.sendall(sys.stdin.buffer.read()); s.shutdown(socket.SHUT_WR)\n"
        "out = b''\n"
        "while chunk := s.recv(65536): out += chunk\n"
        "sys.stdout.write(out[4:].hex())\n")
    for body, expect in ((p.encode_ask(p.Send(event=encode(forged))), "ok"),
                         (p.frame(b"\x00" * 10), "MALFORMED"),
                         (p.encode_ask(p.Send(event=encode(ev.NodeDrained.new(
                             stream="node-node-0", actor=f"user/{b}", correlation_id="x", node="node-0", user=b)))),
                          "NOT_A_USER_REQUEST")):
        ran = subprocess.run([str(PYTHON), "-c", script, sock], input=body, capture_output=True, timeout=60,
                             user=pwd.getpwnam(a).pw_uid, group=pwd.getpwnam(a).pw_gid, extra_groups=[], cwd="/")
        assert ran.returncode == 0, ran.stderr
        reply = p.decode_reply(bytes.fromhex(ran.stdout.decode()))
        assert reply.user == a
        assert (reply.code or "ok") == expect, reply
    submitted = (await _recorded(gated, job_id, ev.JobSubmitted))[0]
    assert (submitted.user, submitted.actor) == (a, f"user/{a}")
    assert _corral(gated, a, "cancel", job_id).returncode == 0  # A's job: A cancels it
    # over the size limit: refused before the body is read
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(sock)
        s.sendall((p.MAX_ASK_BYTES + 1).to_bytes(4, "big"))
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    assert p.decode_reply(out[4:]).code == "TOO_LARGE"


async def test_a_gateway_killed_is_restarted_and_serves_again(gated: Stack, accounts: tuple[str, str]) -> None:
    """Supervised like every process of `corral up`: after kill -9 its socket file is left behind,
    and the restarted gateway replaces it."""
    a, _ = accounts
    gateway = gated.process("gateway")
    old = gateway.pid
    gateway.kill()
    for _ in range(200):
        gated.supervise()
        if gateway.alive() and gateway.pid != old:
            break
        await asyncio.sleep(0.1)
    assert gateway.alive() and gateway.pid != old
    for _ in range(100):  # until it listens again
        me = _corral(gated, a, "whoami")
        if me.returncode == 0:
            break
        await asyncio.sleep(0.2)
    assert me.returncode == 0 and a in me.stdout, me
    done = _corral(gated, a, "submit", "-", stdin=_spec_text())
    assert done.returncode == 0 and "admitted" in done.stdout, done.stderr
    assert _corral(gated, a, "cancel", _job_id(done.stdout)).returncode == 0


async def test_submission_ids_through_the_gateway_are_each_accounts_own(gated: Stack,
                                                                        accounts: tuple[str, str]) -> None:
    """A pipeline's idempotent submit works through the gateway, and another account's equal id
    neither drops nor takes it."""
    a, b = accounts
    sid = f"nightly-{secrets.token_hex(3)}"
    first = _corral(gated, a, "submit", "-", stdin=_spec_text(submission_id=sid))
    theirs = _corral(gated, b, "submit", "-", stdin=_spec_text(submission_id=sid))
    again = _corral(gated, a, "submit", "-", stdin=_spec_text(submission_id=sid))
    for done in (first, theirs, again):
        assert done.returncode == 0 and "admitted" in done.stdout, (done.stdout, done.stderr)
    assert _job_id(again.stdout) == _job_id(first.stdout) != _job_id(theirs.stdout)
    submitted = (await _recorded(gated, _job_id(theirs.stdout), ev.JobSubmitted))[0]
    assert submitted.user == b
    assert _corral(gated, a, "cancel", _job_id(first.stdout)).returncode == 0
    assert _corral(gated, b, "cancel", _job_id(theirs.stdout)).returncode == 0


async def test_the_gateway_credential_publishes_user_requests_and_nothing_else(gated: Stack) -> None:
    """What a stolen gateway credential can do, asked of the real nats-server."""
    assert gated.context is not None
    subjects = Subjects(NS)
    job_id = "jgw" + secrets.token_hex(5)
    common: dict[str, Any] = {"stream": job_stream(job_id), "actor": "placement", "job_id": job_id}
    forged: list[tuple[str, ev.Event]] = [
        (subjects.event("JobCompleted"), ev.JobCompleted.new(**common)),
        (subjects.node_report("node-0", "WorkerExited"),
         ev.WorkerExited.new(**common, rank=0, node="node-0", exit_code=0,
                             reason=Reason(code="COMPLETED", message="forged"))),
        (f"{NS}.inbox.QueueConfigured", ev.JobCompleted.new(**common)),
        (f"{NS}.inbox.admin.root.JobCancelRequested",
         ev.JobCancelRequested.new(**{**common, "actor": "admin/root"}, user="root")),
    ]
    async with await Bus.connect(gated.context.nats_url, NS, ca=gated.context.nats_ca,
                                 credentials=str(gated.options.data_dir / "credentials" / "gateway.json")) as bus:
        bus._check_subject = lambda subject: None  # type: ignore[method-assign]  # ask the server, not the client
        for subject, event in forged:
            assert await refused(bus, subject, bus.publish(subject, encode(event), event.event_id, timeout=1.5)), \
                subject
        info = f"$JS.API.STREAM.INFO.{subjects.events_stream}"  # no JetStream API: no stream, no consumer
        assert await refused(bus, info, bus.nc.request(info, b"", timeout=1.5))
    async with await Client.connect(gated.context, bus=False) as reader:  # type: ignore[arg-type]
        assert not await reader.job_events(job_id)


async def test_hold_release_requeue_and_why_through_the_gateway(gated: Stack, accounts: tuple[str, str]) -> None:
    a, b = accounts
    whole = {"replicas": 2, "gpus_per_replica": 8}  # every GPU of the cluster
    running = _corral(gated, a, "submit", "-", "--wait", "--timeout", "90", stdin=_spec_text(**whole))
    assert running.returncode == 0 and "RUNNING" in running.stdout, (running.stdout, running.stderr)
    first = running.stdout.split(":")[0].strip()
    waiting = _corral(gated, a, "submit", "-", stdin=_spec_text(**whole))
    assert waiting.returncode == 0, waiting.stderr
    second = _job_id(waiting.stdout)
    try:
        theirs = _corral(gated, b, "hold", second)
        assert theirs.returncode == 4 and "NOT_OWNER" in theirs.stderr, (theirs.stdout, theirs.stderr)
        held = _corral(gated, a, "hold", second)
        assert held.returncode == 0 and "held" in held.stdout, (held.stdout, held.stderr)
        why = _corral(gated, a, "why", second)
        assert why.returncode == 0 and "JobHeld" in why.stdout and f"user/{a}" in why.stdout, why.stdout
        released = _corral(gated, a, "release", second)
        assert released.returncode == 0 and "released" in released.stdout, (released.stdout, released.stderr)
        requeued = _corral(gated, a, "requeue", first)
        assert requeued.returncode == 0, (requeued.stdout, requeued.stderr)
        recorded = await _recorded(gated, first, ev.JobRequeueRequested)
        assert recorded and recorded[0].user == a, recorded
    finally:
        for job_id in (first, second):
            _corral(gated, a, "cancel", job_id)
