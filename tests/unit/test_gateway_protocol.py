"""The local gateway's pure parts: framing, who the kernel says is asking, what a request becomes.

The gateway publishes for any local account, so each rule here is what keeps one account from
passing as another: the user and actor come from the uid, never the client; only a person's
requests are carried; a frame announcing more than the limit is refused before it is read; a
body that is not exactly a gateway request is refused, naming why.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import socket
import struct
import tempfile
from dataclasses import replace
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.bus import auth
from corral.contracts import events as ev
from corral.contracts.envelope import job_stream
from corral.contracts.jobspec import JobSpec
from corral.contracts.registry import decode, encode
from corral.gateway import protocol as p
from corral.gateway.local import gateway_socket
from corral.gateway.paths import MAX_SUN_PATH, bindable
from corral.projection import JobView
from corral.services.gateway.service import HIDDEN, hidden_from
from corral.stack.context import Context, resolve
from corral.stack.up import closed_to_others


def _spec(**kw: object) -> JobSpec:
    return msgspec.convert({"name": "g", "queue": "team-a", "replicas": 1, "gpus_per_replica": 1,
                            "runtime": "sim", "duration_seconds": 5, **kw}, JobSpec)


def _submitted(claimed: str = "bob", submission_id: str | None = None, **spec: object) -> ev.JobSubmitted:
    return ev.JobSubmitted.new(stream=job_stream("j1"), actor=f"user/{claimed}", job_id="j1", spec=_spec(**spec),
                               user=claimed, correlation_id="j1", submission_id=submission_id)


def _reader(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


# ---- framing ----------------------------------------------------------------------------------------
@given(st.lists(st.binary(max_size=2000), max_size=5))
def test_frames_read_back_exactly_what_was_written(bodies: list[bytes]) -> None:
    async def go() -> list[bytes]:
        reader = _reader(b"".join(p.frame(b) for b in bodies))
        return [await p.read_frame(reader, 4096) for _ in bodies]

    assert asyncio.run(go()) == bodies


def test_a_frame_over_the_limit_is_refused_before_its_body_is_read() -> None:
    async def go() -> None:
        # announces 2 GiB and sends none of it: refused at once, nothing allocated or awaited
        await p.read_frame(_reader(struct.pack(">I", 2**31)), p.MAX_ASK_BYTES)

    with pytest.raises(p.FrameTooLarge, match="over the gateway's limit"):
        asyncio.run(go())


def test_a_cut_frame_is_an_incomplete_read_not_a_request() -> None:
    async def go() -> None:
        await p.read_frame(_reader(struct.pack(">I", 10) + b"abc"), 100)

    with pytest.raises(asyncio.IncompleteReadError):
        asyncio.run(go())


@pytest.mark.parametrize("body", [
    b"", b"\xc1", msgspec.msgpack.encode({"op": "sudo"}), msgspec.msgpack.encode({"op": "send"}),
    msgspec.msgpack.encode({"op": "whoami", "user": "bob"}),  # no field names the user
    msgspec.msgpack.encode({"op": "verdict", "job_id": "j1", "wait": 10_000}),
    msgspec.msgpack.encode({"op": "verdict", "job_id": "x" * 500}),
    msgspec.msgpack.encode({"op": "view", "job_ids": ["j"] * 5000}),
    msgspec.msgpack.encode([1, 2, 3]),
])
def test_anything_but_exactly_a_gateway_request_is_refused_as_malformed(body: bytes) -> None:
    with pytest.raises(p.GatewayRefusal) as refused:
        p.decode_ask(body)
    assert refused.value.code == "MALFORMED"


@given(st.binary(max_size=300))
def test_random_bytes_never_raise_anything_but_a_refusal(body: bytes) -> None:
    try:
        p.decode_ask(body)
    except p.GatewayRefusal:
        pass


def test_requests_and_replies_round_trip() -> None:
    for ask in (p.WhoAmI(), p.Send(event=b"{}"), p.Verdict(job_id="j1", wait=3.0),
                p.Answer(event=b"{}", wait=2.0), p.View(job_ids=["j1"], states=["COMPLETED"]),
                p.JobEvents(job_id="j1")):
        assert p.decode_ask(p.encode_ask(ask)[4:]) == ask
    reply = p.Reply(ok=False, user="alice", code="NOT_OWNER", error="no")
    assert p.decode_reply(p.encode_reply(reply)[4:]) == reply
    answered = p.Reply(ok=True, user="alice", event=b"{}", verdict="refused", version=3, job_id="j1")
    assert p.decode_reply(p.encode_reply(answered)[4:]) == answered


# ---- who is asking --------------------------------------------------------------------------------
def test_the_peer_uid_is_the_kernels_answer() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert p.peer_uid(a) == os.getuid()


def _pw(name: str, uid: int) -> pwd.struct_passwd:
    return pwd.struct_passwd((name, "x", uid, uid, "", "/home/" + name, "/bin/sh"))


def test_uid_maps_to_its_account_name_and_root_is_root() -> None:
    assert p.account_of(0) == pwd.getpwuid(0).pw_name == "root"
    assert p.account_of(1234, lambda uid: _pw("john.doe", uid)) == "john.doe"


def test_a_uid_without_a_name_or_with_a_name_the_bus_cannot_carry_is_refused() -> None:
    def missing(uid: int) -> pwd.struct_passwd:
        raise KeyError(uid)

    with pytest.raises(p.GatewayRefusal, match="no account name") as refused:
        p.account_of(4242, missing)
    assert refused.value.code == "NO_ACCOUNT"
    for name in ("alice@EXAMPLE.COM", "a b", "a*", "a>", ".hidden", "x" * 65, "DOMAIN\\bob", "m$"):
        with pytest.raises(p.GatewayRefusal) as refused:
            p.account_of(5000, lambda uid, name=name: _pw(name, uid))
        assert refused.value.code == "BAD_ACCOUNT", name


# ---- what a request becomes -------------------------------------------------------------------------
@given(claimed=st.sampled_from(["bob", "root", "alice", "admin"]), spec_user=st.sampled_from([None, "bob", "root"]))
def test_a_request_is_the_accounts_whatever_it_claims(claimed: str, spec_user: str | None) -> None:
    sent = _submitted(claimed, **({"user": spec_user} if spec_user else {}))
    event = p.as_account(encode(sent), "alice")
    assert isinstance(event, ev.JobSubmitted)
    assert (event.user, event.actor) == ("alice", "user/alice")
    assert decode(encode(event)) == event  # still a valid contract event


def test_every_user_request_type_is_rewritten_and_nothing_else_is_carried() -> None:
    common = {"stream": job_stream("j1"), "actor": "user/bob", "job_id": "j1", "user": "bob", "correlation_id": "j1"}
    for cls in (ev.JobCancelRequested, ev.JobHeld, ev.JobHoldReleased, ev.JobRequeueRequested):
        event = p.as_account(encode(cls.new(**common)), "alice")  # type: ignore[attr-defined]
        assert (type(event), event.user, event.actor) == (cls, "alice", "user/alice")
    drained = ev.NodeDrained.new(stream="node-n0", actor="user/bob", correlation_id="n0", node="n0", user="bob")
    with pytest.raises(p.GatewayRefusal, match="not a person's request") as refused:
        p.as_account(encode(drained), "alice")
    assert refused.value.code == "NOT_A_USER_REQUEST"
    with pytest.raises(p.GatewayRefusal) as refused:
        p.as_account(b'{"type": "JobSubmitted"}', "alice")
    assert refused.value.code == "MALFORMED"


def test_a_submission_id_is_scoped_to_the_account_in_the_message_id() -> None:
    alice = p.as_account(encode(_submitted("x", submission_id="nightly")), "alice")
    bob = p.as_account(encode(_submitted("x", submission_id="nightly")), "bob")
    assert p.message_id(alice) == p.message_id(alice) != p.message_id(bob)
    assert p.message_id(alice, b"gateway-key") != p.message_id(alice)  # keyed: not computable by others
    plain = p.as_account(encode(_submitted("x")), "alice")
    assert p.message_id(plain) == plain.event_id


def test_other_peoples_env_values_are_hidden_and_ones_own_are_not() -> None:
    mine = JobView(job_id="j1", user="alice", spec=_spec(env={"TOKEN": "a-secret"}))
    theirs = JobView(job_id="j2", user="bob", spec=_spec(env={"TOKEN": "b-secret"}))
    hidden_from("alice", [mine, theirs])
    assert mine.spec is not None and mine.spec.env == {"TOKEN": "a-secret"}
    assert theirs.spec is not None and theirs.spec.env == {"TOKEN": HIDDEN}


# ---- the gateway's NATS identity ------------------------------------------------------------------
def test_the_gateway_identity_publishes_exactly_the_user_request_subjects() -> None:
    gw = auth.gateway("corral", "pw")
    assert gw.role is auth.Role.GATEWAY and gw.user == auth.GATEWAY_USER
    assert gw.publish == ("corral.inbox.user.*.JobSubmitted", "corral.inbox.user.*.JobCancelRequested",
                          "corral.inbox.user.*.JobHeld", "corral.inbox.user.*.JobHoldReleased",
                          "corral.inbox.user.*.JobRequeueRequested")
    assert gw.subscribe == ("_INBOX.gateway.>",)


# ---- long socket paths ------------------------------------------------------------------------------
def test_a_socket_path_too_long_for_the_kernel_is_reached_through_its_folder(tmp_path: Path) -> None:
    deep = os.path.join(str(tmp_path), *(["d" * 40] * 4))
    os.makedirs(deep)
    path = os.path.join(deep, "gateway.sock")
    assert len(path) > MAX_SUN_PATH
    server = socket.socket(socket.AF_UNIX)
    with server, bindable(path) as where:
        server.bind(where)
        server.listen()
        assert os.path.exists(path)  # the socket has its real name
        client = socket.socket(socket.AF_UNIX)
        with client, bindable(path) as again:
            client.connect(again)


# ---- when the CLI goes through the gateway ------------------------------------------------------------
def test_the_cli_uses_the_gateway_only_without_a_credential_it_can_read(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(p.SOCKET_ENV, raising=False)
    mine = tmp_path / "mine.json"
    mine.write_text("{}")
    ctx = Context(nats_url="tls://h:4222", postgres_dsn="", gateway="/run/g.sock")
    assert gateway_socket(ctx) == "/run/g.sock"  # the context names no credential
    assert gateway_socket(replace(ctx, credentials=str(mine))) is None  # one of its own: no gateway
    assert gateway_socket(replace(ctx, credentials=str(tmp_path / "admins-0600.json"))) == "/run/g.sock"
    assert gateway_socket(replace(ctx, gateway=None)) is None  # no gateway known: none
    monkeypatch.setenv(p.SOCKET_ENV, "/elsewhere.sock")
    assert gateway_socket(replace(ctx, gateway=None)) == "/elsewhere.sock"


def test_corral_gateway_alone_is_a_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A login node's person has no context file: the socket is enough."""
    monkeypatch.chdir(tmp_path)
    for var in ("CORRAL_NATS_URL", "CORRAL_POSTGRES_DSN", "CORRAL_CONTEXT", "CORRAL_CREDENTIALS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(p.SOCKET_ENV, "/run/corral-gateway/gateway.sock")
    ctx = resolve()
    assert ctx.gateway == "/run/corral-gateway/gateway.sock" and ctx.credentials is None
    assert gateway_socket(ctx) == "/run/corral-gateway/gateway.sock"


def test_corral_up_names_the_folder_that_keeps_people_from_the_gateway() -> None:
    top = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's tmp_path lies under a 0700 folder
    try:
        inner = top / "a" / "b"
        inner.mkdir(parents=True)
        os.chmod(top, 0o755)
        os.chmod(top / "a", 0o700)
        assert closed_to_others(inner) == top / "a"
        os.chmod(top / "a", 0o711)
        assert closed_to_others(inner) is None
    finally:
        shutil.rmtree(top)
