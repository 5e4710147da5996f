"""The local gateway: a person's requests, recorded as their OS account, with no credential file.

Slurm's munge model, with the kernel as the signer: on a host where people log in (the one that
runs `corral up`, a login node), the gateway listens on a unix socket anyone may connect to,
asks the kernel who connected (`SO_PEERCRED`: the peer's uid, fixed at `connect`, which the client
cannot choose), maps the uid to its account name (`getpwuid`) and publishes the request on
`<ns>.inbox.user.<account>.<Type>` with its own NATS identity (`corral.bus.auth.gateway`: those
subjects and nothing else). Admission records the subject's user; so whatever the client wrote
in the request, `$USER` or the spec, the request is the account's (`corral.gateway.protocol`).

It also answers what a person waits for after a request, read with its own read login: the
verdict on one of their jobs, the verdict on a request (`corral.verdicts`), the read model's
view and a job's events. What it passes on hides the `env` values of other people's jobs.

Each connection carries one request; a uid holds at most `per_uid` connections at once and the
gateway `total` (a local user cannot starve the others), and a request not read within
`read_timeout` seconds, or a reply not taken within `write_timeout`, is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import stat
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import msgspec

from corral.bus import Bus
from corral.client import refuse_oversized
from corral.contracts import events as ev
from corral.contracts.envelope import Event, job_stream
from corral.contracts.flow import names
from corral.contracts.problems import ContractError, SpecError
from corral.contracts.registry import decode, encode
from corral.contracts.subjects import Subjects
from corral.eventstore import EventStore, StoredEvent
from corral.gateway import protocol as p
from corral.gateway.paths import bindable
from corral.projection import JobView
from corral.readmodel.codec import encode_hot, encode_job
from corral.readmodel.snapshots import read_view
from corral.telemetry import tracing
from corral.verdicts import read_verdict

log = logging.getLogger("corral.gateway")
#: The events that answer a submission, and the submission itself.
_VERDICTS = names((ev.JobAdmitted, ev.JobRejected))
_SUBMITTED = ev.JobSubmitted.type_name()

#: What another person's job shows in place of each `env` value.
HIDDEN = "(hidden)"
#: How long a request waits out an unavailable bus before failing (the message id makes retries harmless).
PUBLISH_RETRY_SECONDS = 30.0


class Gateway:
    """Serves `corral.gateway.protocol` on a unix socket for one installation."""

    def __init__(self, bus: Bus, store: EventStore, namespace: str, *, per_uid: int = 8, total: int = 256,
                 read_timeout: float = 10.0, write_timeout: float = 60.0, msg_key: bytes | None = None) -> None:
        self.bus = bus
        self.store = store
        self.subjects = Subjects(namespace)
        self.per_uid = per_uid
        self.total = total
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        self._open: Counter[int] = Counter()
        #: requests answered, by (op, outcome code or "ok"): the /metrics counters
        self.answered: Counter[tuple[str, str]] = Counter()
        #: keys the msg ids of submissions with a submission id (`p.message_id`): the gateway's own
        #: secret (its credentials file), so a retry after a restart has the same msg id, the verdict
        #: on a request sent before it is still found, and no one else can compute one
        self.msg_key = msg_key if msg_key is not None else secrets.token_bytes(32)

    # ---- the socket ------------------------------------------------------------------------------
    async def listen(self, path: str) -> asyncio.AbstractServer:
        """Listen on `path` (mode 0666: any local account may connect; who it is, the kernel says).
        A socket left by a previous run is replaced; anything else at `path` is an error."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISSOCK(target.lstat().st_mode):
                raise FileExistsError(f"{path} exists and is not a socket: remove it or give the gateway another path")
            target.unlink()
        with bindable(path) as where:
            server = await asyncio.start_unix_server(self.handle, path=where)
        os.chmod(path, 0o666)
        log.info("gateway: listening on %s", path)
        return server

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        uid = -1
        try:
            uid = p.peer_uid(writer.get_extra_info("socket"))
            self._open[uid] += 1
            reply = await self._reply(reader, uid)
            writer.write(p.encode_reply(reply))
            await asyncio.wait_for(writer.drain(), self.write_timeout)  # a peer that never reads
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, OSError):
            pass  # the peer went away, or sent half a request: nothing to answer
        finally:
            if uid >= 0:
                self._open[uid] -= 1
                if self._open[uid] <= 0:
                    del self._open[uid]
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _reply(self, reader: asyncio.StreamReader, uid: int) -> p.Reply:
        account, op = "", "?"
        try:
            if self._open[uid] > self.per_uid or sum(self._open.values()) > self.total:
                raise p.GatewayRefusal("BUSY", f"too many requests at once from uid {uid}: wait for them to end")
            account = p.account_of(uid)
            body = await asyncio.wait_for(p.read_frame(reader, p.MAX_ASK_BYTES), self.read_timeout)
            ask = p.decode_ask(body)
            op = type(ask).__name__
            reply = await self.answer(ask, account)
        except p.GatewayRefusal as refusal:
            log.info("gateway: refused %s of uid %d (%s): %s: %s", op, uid, account or "?", refusal.code,
                     refusal.message)
            reply = p.Reply(ok=False, user=account, code=refusal.code, error=refusal.message)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            raise
        except Exception as exc:  # a bug or a lost dependency: the caller gets one line, the log the trace
            log.exception("gateway: %s of uid %d failed", op, uid)
            reply = p.Reply(ok=False, user=account, code="FAILED",
                            error=f"the gateway failed: {type(exc).__name__}: {exc}")
        self.answered[(op, reply.code or "ok")] += 1
        return reply

    # ---- the requests --------------------------------------------------------------------------
    async def answer(self, ask: p.Ask, account: str) -> p.Reply:
        """The reply to `ask` from `account` (the account the kernel named)."""
        if isinstance(ask, p.WhoAmI):
            return p.Reply(ok=True, user=account)
        if isinstance(ask, p.Send):
            return p.Reply(ok=True, user=account, event=encode(await self.send(ask.event, account)))
        if isinstance(ask, p.Verdict):
            found = await self.verdict(ask.job_id, account, ask.wait)
            return p.Reply(ok=True, user=account, event=encode(found) if found is not None else None)
        if isinstance(ask, p.Answer):
            event = p.as_account(ask.event, account)
            verdict = await read_verdict(self.store, event, p.message_id(event, self.msg_key), ask.wait)
            return p.Reply(ok=True, user=account, event=encode(verdict.event) if verdict.event is not None else None,
                           verdict=verdict.kind.value, version=verdict.version, job_id=verdict.job_id or "")
        if isinstance(ask, p.View):
            view = await read_view(self.store, job_ids=ask.job_ids, states=ask.states)
            hidden_from(account, view.jobs.values())
            finished = [encode_job(j) for job_id, j in view.jobs.items() if job_id not in view.active]
            return p.Reply(ok=True, user=account, hot=encode_hot(view), finished=finished)
        if isinstance(ask, p.JobEvents):
            stored = await self.store.read_stream(job_stream(ask.job_id))
            owner = _owner(stored)
            return p.Reply(ok=True, user=account, events=[_row(s, owner == account) for s in stored])
        raise p.GatewayRefusal("MALFORMED", f"unknown request {type(ask).__name__}")

    async def send(self, data: bytes, account: str) -> Event:
        """Publish the request in `data` as `account`'s; the request as published."""
        event = p.as_account(data, account)
        if isinstance(event, ev.JobSubmitted):
            try:
                refuse_oversized(event, self.bus.limits.max_spec_bytes)
            except SpecError as exc:
                raise p.GatewayRefusal("TOO_LARGE", "; ".join(problem.message for problem in exc.problems)) from None
        subject = self.subjects.user_request(account, event.type)
        await self.bus.publish(subject, encode(event), p.message_id(event, self.msg_key),
                               {tracing.CORRELATION: event.correlation_id}, retry_for=PUBLISH_RETRY_SECONDS)
        log.info("gateway: %s of %s published on %s", event.type, account, subject)
        return event

    async def verdict(self, job_id: str, account: str, wait: float) -> Event | None:
        """Admission's verdict on `account`'s job `job_id`, waited for up to `wait` seconds."""
        stream, after = job_stream(job_id), 1
        owner: str | None = None
        deadline = asyncio.get_running_loop().time() + wait
        interval = 0.05
        while True:
            for stored in await self.store.read_stream(stream, after):
                after = stored.version + 1
                if stored.version == 1:
                    owner = _owner([stored])
                if stored.type in _VERDICTS and owner == account:
                    return _decoded(stored)
            if owner is not None and owner != account:
                raise p.GatewayRefusal("NOT_OWNER", f"{job_id} is not a job of {account}")
            if asyncio.get_running_loop().time() >= deadline:
                return None
            await asyncio.sleep(interval)
            interval = min(interval * 2, 0.5)

    def metrics_text(self) -> bytes:
        lines = ["# TYPE corral_gateway_requests_total counter"]
        lines += [f'corral_gateway_requests_total{{op="{op}",outcome="{code}"}} {n}'
                  for (op, code), n in sorted(self.answered.items())]
        lines.append(f"corral_gateway_open_connections {sum(self._open.values())}")
        return ("\n".join(lines) + "\n").encode()


def hidden_from(account: str, jobs: Iterable[JobView]) -> None:
    """Hide the `env` values of the jobs `account` did not submit (their names stay)."""
    for job in jobs:
        if job.user != account and job.spec is not None and job.spec.env:
            job.spec = msgspec.structs.replace(job.spec, env=dict.fromkeys(job.spec.env, HIDDEN))


def _decoded(stored: StoredEvent) -> Event | None:
    try:
        return decode(stored.data)
    except ContractError:
        return None


def _owner(stored: list[StoredEvent]) -> str | None:
    """Who submitted the job of this stream (its JobSubmitted's user)."""
    for s in stored:
        if s.type == _SUBMITTED:
            event = _decoded(s)
            return getattr(event, "user", None)
    return None


def _row(stored: StoredEvent, own: bool) -> p.StoredRow:
    data = stored.data
    if not own and stored.type == _SUBMITTED:
        event = _decoded(stored)
        if isinstance(event, ev.JobSubmitted) and event.spec.env:
            data = encode(msgspec.structs.replace(
                event, spec=msgspec.structs.replace(event.spec, env=dict.fromkeys(event.spec.env, HIDDEN))))
    return p.StoredRow(event_id=stored.event_id, stream=stored.stream, type=stored.type,
                       schema_version=stored.schema_version, data=bytes(data),
                       correlation_id=stored.correlation_id, causation_id=stored.causation_id,
                       occurred_at=stored.occurred_at.isoformat(), version=stored.version,
                       position=stored.position, recorded_at=stored.recorded_at.isoformat())
