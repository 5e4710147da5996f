"""The client side of Corral: what the CLI, pipelines in Python and tests use.

Why this shape: requests (submit, cancel, apply queues) go where any pipeline would put them — the
JetStream inbox, deduplicated by `Nats-Msg-Id` — so the CLI has no privileged path. Questions
(jobs, nodes, why, replay) are answered from the Postgres event log alone, read-only: the log is
the truth, and folding it up to a moment rebuilds the cluster as it was then.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime

from corral.bus import Bus
from corral.bus.limits import BusLimits
from corral.contracts import events as ev
from corral.contracts.envelope import Event, job_stream, new_event_id, queue_stream
from corral.contracts.jobspec import JobSpec
from corral.contracts.problems import ContractError, SpecError
from corral.contracts.queues import QueuesFile
from corral.contracts.registry import decode, encode
from corral.contracts.sizes import recorded_size, size_problem
from corral.contracts.subjects import USER_REQUEST_TYPES, Subjects
from corral.eventstore import EventStore, StoredEvent
from corral.projection import ClusterView
from corral.stack.context import Context
from corral.stack.credentials import NatsCredentials


def _user() -> str:
    """Who is asking: $USER, else the login name of this process."""
    import getpass

    try:
        return os.environ.get("USER") or getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def new_job_id(now: datetime | None = None) -> str:
    """Short, time-sortable, unique enough to type: 'j' + 10 time chars + 4 random chars, lower case."""
    ulid = new_event_id(now or datetime.now(UTC)).lower()
    return f"j{ulid[:10]}{ulid[-4:]}"


def refuse_oversized(submitted: ev.JobSubmitted, limit: int | None = None) -> None:
    """SpecError (field `spec`, with the size, the limit and the fix) if this submission is larger
    than admission accepts: refused here, before anything is published."""
    problem = size_problem(recorded_size(submitted), BusLimits.from_env().max_spec_bytes if limit is None else limit)
    if problem is not None:
        raise SpecError([problem])


def check_spec_size(spec: JobSpec) -> None:
    """`refuse_oversized` for a spec not yet submitted (what `corral submit|validate` check)."""
    job_id = new_job_id()
    refuse_oversized(ev.JobSubmitted.new(stream=job_stream(job_id), actor=f"user/{_user()}", job_id=job_id,
                                         spec=spec, submission_id=spec.submission_id, user=spec.user or _user()))


class Client:
    """Connections to one Corral installation (open with `await Client.connect(ctx)`)."""

    def __init__(self, ctx: Context, store: EventStore, bus: Bus | None) -> None:
        self.ctx = ctx
        self.store = store
        self._bus = bus
        self.subjects = Subjects(ctx.namespace)

    @classmethod
    async def connect(cls, ctx: Context, *, bus: bool = True, timeout: float = 5.0) -> Client:
        store = await asyncio.wait_for(EventStore.open(ctx.postgres_dsn, pool_size=4), timeout)
        nats = None
        if bus:
            try:
                nats = await asyncio.wait_for(Bus.connect(ctx.nats_url, ctx.namespace, name="corral-cli",
                                                          credentials=ctx.credentials, ca=ctx.nats_ca), timeout)
                await nats.ensure_streams()  # idempotent; a request must never race the services' start
            except BaseException:
                await store.close()
                raise
        return cls(ctx, store, nats)

    async def close(self) -> None:
        if self._bus is not None:
            await self._bus.close()
        await self.store.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    @property
    def bus(self) -> Bus:
        if self._bus is None:
            raise RuntimeError("this client was opened without NATS (bus=False)")
        return self._bus

    # ---- requests (inbox) --------------------------------------------------------------------
    @property
    def identity(self) -> str | None:
        """The NATS identity this client connects as (its context's credentials), if any."""
        if not self.ctx.credentials:
            return None
        return NatsCredentials.load(self.ctx.credentials).user

    def _request_subject(self, event: Event) -> str:
        """With an identity, jobs and cancels go to `<ns>.inbox.user.<user>.<Type>`: NATS lets it
        publish only under its own name, and admission records that name (see `corral.bus.auth`).
        Without one (an open bus, the tests' superuser), the bare `<ns>.inbox.<Type>`."""
        user = getattr(event, "user", None)
        if self.identity is not None and user and event.type in USER_REQUEST_TYPES:
            try:
                return self.subjects.user_request(user, event.type)
            except ValueError:
                pass  # a name that cannot be a subject token: only an open bus takes it
        return self.subjects.inbox(event.type)

    #: How long a request waits out an unavailable bus (a NATS server lost, a stream electing its
    #: leader) before failing: the msg id makes every retry harmless.
    REQUEST_RETRY_SECONDS = 30.0

    async def publish_request(self, event: Event, msg_id: str | None = None) -> None:
        await self.bus.publish(self._request_subject(event), encode(event), msg_id or event.event_id,
                               retry_for=self.REQUEST_RETRY_SECONDS)

    async def submit(self, spec: JobSpec, *, job_id: str | None = None, user: str | None = None) -> str:
        job_id = job_id or new_job_id()
        user = user or self.identity or spec.user or _user()
        submitted = ev.JobSubmitted.new(stream=job_stream(job_id), actor=f"user/{user}", correlation_id=job_id,
                                        job_id=job_id, spec=spec, submission_id=spec.submission_id, user=user)
        refuse_oversized(submitted, self.bus.limits.max_spec_bytes)
        await self.publish_request(submitted, spec.submission_id or submitted.event_id)
        return job_id

    async def verdict(self, job_id: str, timeout: float,
                      interval: float = 0.05) -> ev.JobAdmitted | ev.JobRejected | None:
        """Admission's verdict on a submitted job (JobAdmitted or JobRejected), read from the job's
        stream in the log; None when admission has not judged it within `timeout` (it still will:
        the submission waits in the inbox)."""
        deadline = time.monotonic() + timeout
        stream = job_stream(job_id)
        after = 1
        while True:
            for stored in await self.store.read_stream(stream, after):
                after = stored.version + 1
                if stored.type not in ("JobAdmitted", "JobRejected"):
                    continue
                try:
                    event = decode(stored.data)
                except ContractError:
                    continue
                if isinstance(event, (ev.JobAdmitted, ev.JobRejected)):
                    return event
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(interval)
            interval = min(interval * 2, 0.5)

    async def cancel(self, job_id: str, *, user: str | None = None, message: str = "") -> None:
        user = user or self.identity or _user()
        request = ev.JobCancelRequested.new(stream=job_stream(job_id), actor=f"user/{user}", correlation_id=job_id,
                                            job_id=job_id, user=user, message=message or f"cancelled by {user}")
        await self.publish_request(request)

    async def apply_queues(self, queues: QueuesFile, *, user: str | None = None) -> list[str]:
        user = user or _user()
        names = []
        for spec in queues.resolved():
            configured = ev.QueueConfigured.new(stream=queue_stream(spec.name), actor=f"user/{user}",
                                                correlation_id=spec.name, queue=spec)
            await self.publish_request(configured)
            names.append(spec.name)
        return names

    # ---- questions (the log) -----------------------------------------------------------------
    async def events(self, *, after: int = 0, until: datetime | None = None,
                     types: list[str] | None = None) -> list[tuple[StoredEvent, Event]]:
        """Decoded events of the log in global order (up to `until`, when given)."""
        out: list[tuple[StoredEvent, Event]] = []
        while True:
            batch = await self.store.read_all(after, limit=5000)
            if not batch:
                return out
            for stored in batch:
                if until is not None and stored.recorded_at > until:
                    return out
                if types and stored.type not in types:
                    continue
                try:
                    out.append((stored, decode(stored.data)))
                except ContractError:
                    continue
            after = batch[-1].position

    async def job_events(self, job_id: str) -> list[tuple[StoredEvent, Event]]:
        out = []
        for stored in await self.store.read_stream(job_stream(job_id)):
            try:
                out.append((stored, decode(stored.data)))
            except ContractError:
                continue
        return out

    async def view(self, until: datetime | None = None) -> ClusterView:
        """The cluster folded from the log, as of `until` (recorded time) or now."""
        view = ClusterView()
        for stored, event in await self.events(until=until):
            view.apply(event, stored.version, stored.position)
        return view

    async def wait_for(self, predicate: Callable[[ClusterView], bool], timeout: float,
                       interval: float = 0.2) -> ClusterView:
        """Poll the log until `predicate(view)` holds; TimeoutError with the last view otherwise."""
        deadline = time.monotonic() + timeout
        view = ClusterView()
        after = 0
        while True:
            for stored in await self.store.read_all(after, limit=5000):
                try:
                    view.apply(decode(stored.data), stored.version, stored.position)
                except ContractError:
                    pass
                after = stored.position
            if predicate(view):
                return view
            if time.monotonic() > deadline:
                raise TimeoutError(f"condition not met within {timeout}s")
            await asyncio.sleep(interval)
