"""`corral` through the local gateway: a person with no credential file of their own.

`corral.cli.session.connect` returns a `GatewayClient` when the context names a gateway socket and no
credential this process can read (`corral.gateway.local.gateway_socket`). Requests go to the gateway, which records
them as the connecting uid's account (`corral.gateway.protocol`); what the commands read after
a request (its verdict, the read model's view, a job's events) comes back through
the gateway too, with other people's `env` values hidden. Questions that fold the whole log
(`corral events`, `replay`, `usage`, `audit`) need a read login of one's own and say so.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection
from datetime import datetime
from typing import Any, NoReturn

from corral.bus.limits import BusLimits
from corral.client import Client
from corral.contracts import events as ev
from corral.contracts.envelope import Event
from corral.contracts.problems import ContractError
from corral.contracts.registry import decode, encode
from corral.eventstore import StoredEvent
from corral.gateway import protocol as p
from corral.gateway.local import GatewayError
from corral.gateway.paths import bindable
from corral.projection import ClusterView, JobView
from corral.readmodel.codec import decode_hot, decode_job
from corral.readmodel.pages import JobFilter, page_of
from corral.readmodel.snapshots import FINISHED
from corral.stack.context import Context
from corral.verdicts import Verdict, VerdictKind


async def call(path: str, ask: p.Ask, timeout: float) -> p.Reply:
    """One request to the gateway at `path` and its reply; GatewayError when it cannot be reached
    or refuses."""
    try:
        with bindable(path) as where:
            reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(where), 5.0)
    except (OSError, TimeoutError) as exc:
        raise GatewayError(f"cannot reach the Corral gateway at {path} ({type(exc).__name__}: {exc}); "
                           "is `corral up` (or `corral service gateway`) running?", "UNREACHABLE") from None
    try:
        writer.write(p.encode_ask(ask))
        await writer.drain()
        body = await asyncio.wait_for(p.read_frame(reader, p.MAX_REPLY_BYTES), timeout)
    except (OSError, TimeoutError, asyncio.IncompleteReadError, p.GatewayRefusal) as exc:
        raise GatewayError(f"the Corral gateway at {path} did not answer ({type(exc).__name__}: {exc})",
                           "UNREACHABLE") from None
    finally:
        writer.close()
    reply = p.decode_reply(body)
    if not reply.ok:
        raise GatewayError(f"the gateway refused: {reply.code}: {reply.error}", reply.code)
    return reply


def needs_login() -> NoReturn:
    raise GatewayError("this command reads the whole event log, which takes a read login of your own "
                       "(ask an admin for one); through the gateway, `corral jobs`, `show`, `why`, "
                       "`submit`, `cancel`, `hold`, `release` and `requeue` work", "NEEDS_LOGIN")


def who(path: str) -> str:
    """The account the gateway at `path` takes this process for (`corral whoami`)."""
    return asyncio.run(call(path, p.WhoAmI(), 10.0)).user


class _NoStore:
    """Stands where a read login would be: every use says what to do instead."""

    def __getattr__(self, name: str) -> NoReturn:
        needs_login()

    async def close(self) -> None:
        return None


class GatewayClient(Client):
    """A `Client` whose requests and reads go through the local gateway."""

    #: How long a call waits for the gateway beyond the wait it asked for.
    SLACK_SECONDS = 35.0

    def __init__(self, ctx: Context, path: str, account: str) -> None:
        super().__init__(ctx, _NoStore(), None)  # type: ignore[arg-type]
        self.gateway = path
        self.account = account

    @classmethod
    async def open(cls, ctx: Context, path: str) -> GatewayClient:
        reply = await call(path, p.WhoAmI(), cls.SLACK_SECONDS)
        return cls(ctx, path, reply.user)

    async def close(self) -> None:
        return None

    @property
    def identity(self) -> str | None:
        return self.account

    @property
    def is_admin(self) -> bool:
        """Never: the gateway carries a person's requests only (an admin acts with their login)."""
        return False

    @property
    def max_spec_bytes(self) -> int:
        return BusLimits.from_env().max_spec_bytes

    async def _call(self, ask: p.Ask, wait: float = 0.0) -> p.Reply:
        return await call(self.gateway, ask, wait + self.SLACK_SECONDS)

    async def publish_request(self, event: Event, msg_id: str | None = None) -> None:
        await self._call(p.Send(event=encode(event)))

    async def verdict(self, job_id: str, timeout: float,
                      interval: float = 0.05) -> ev.JobAdmitted | ev.JobRejected | None:
        found = _event((await self._call(p.Verdict(job_id=job_id, wait=_wait(timeout)), _wait(timeout))).event)
        return found if isinstance(found, ev.JobAdmitted | ev.JobRejected) else None

    async def await_verdict(self, request: Event, timeout: float) -> Verdict:
        """The verdict on `request`, read by the gateway (`corral.verdicts.read_verdict`)."""
        wait = _wait(timeout)
        reply = await self._call(p.Answer(event=encode(request), wait=wait), wait)
        kind = VerdictKind(reply.verdict) if reply.verdict else VerdictKind.NO_VERDICT
        return Verdict(request, kind, _event(reply.event), reply.version, reply.job_id or None)

    async def live_view(self, *, job_ids: Collection[str] = (), states: Collection[str] = ()) -> ClusterView:
        reply = await self._call(p.View(job_ids=list(job_ids), states=list(states)))
        view = decode_hot(reply.hot or b"")
        for data in reply.finished:
            job = decode_job(data)
            view.jobs[job.job_id] = job
        return view

    async def nodes_view(self) -> ClusterView:
        """The gateway's view (every active job with the nodes): the fenced ones among them."""
        return await self.live_view()

    async def job(self, job_id: str) -> JobView | None:
        return (await self.live_view(job_ids=[job_id])).jobs.get(job_id)

    async def knows_job(self, job_id: str) -> bool:
        return await self.job(job_id) is not None

    async def jobs_page(self, where: JobFilter, limit: int | None) -> tuple[list[JobView], int]:
        """The page from the gateway's view (every active job, and the finished ones `where` may match)."""
        over = [s for s in FINISHED if (s in where.states if where.states is not None else where.all_jobs)]
        return page_of((await self.live_view(states=over)).jobs.values(), where, limit)

    async def job_events(self, job_id: str) -> list[tuple[StoredEvent, Event]]:
        out = []
        for row in (await self._call(p.JobEvents(job_id=job_id))).events:
            try:
                event = decode(row.data)
            except ContractError:
                continue
            stored = StoredEvent(event_id=row.event_id, stream=row.stream, type=row.type,
                                 schema_version=row.schema_version, data=row.data, correlation_id=row.correlation_id,
                                 causation_id=row.causation_id, occurred_at=datetime.fromisoformat(row.occurred_at),
                                 version=row.version, position=row.position,
                                 recorded_at=datetime.fromisoformat(row.recorded_at))
            out.append((stored, event))
        return out

    async def wait_for(self, predicate: Callable[[ClusterView], bool], timeout: float,
                       interval: float = 0.2, *, job_ids: Collection[str] | None = None) -> ClusterView:
        """Ask the gateway for the view (of `job_ids`) until `predicate` holds."""
        if job_ids is None:
            needs_login()
        deadline = time.monotonic() + timeout
        interval = max(interval, 0.5)
        while True:
            view = await self.live_view(job_ids=job_ids or ())
            if predicate(view):
                return view
            if time.monotonic() > deadline:
                raise TimeoutError(f"condition not met within {timeout}s")
            await asyncio.sleep(interval)

    def describe(self) -> str:
        return f"{self.account} (unix account, via gateway {self.gateway})"


def _wait(timeout: float) -> float:
    return max(0.0, min(float(timeout), p.MAX_WAIT_SECONDS))


def _event(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return decode(data)
    except ContractError:
        return None
