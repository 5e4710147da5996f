"""The client side of Corral: what the CLI, pipelines in Python and tests use.

Why this shape: requests (submit, cancel, apply queues) go where any pipeline would put them — the
JetStream inbox, deduplicated by `Nats-Msg-Id` — so the CLI has no privileged path. Questions
(jobs, nodes, why, replay) are answered from the Postgres event log alone, read-only: the log is
the truth, and folding it up to a moment rebuilds the cluster as it was then. Questions about now
start from the read model the projector keeps (`live_view`) and fold only the log after it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from corral import environment
from corral.bus.limits import BusLimits
from corral.contracts import events as ev
from corral.contracts.envelope import QUEUE_TREE_STREAM, Event, job_stream, new_event_id
from corral.contracts.flow import names
from corral.contracts.jobspec import JobSpec
from corral.contracts.problems import ContractError, SpecError
from corral.contracts.queues import QueuesFile, QueueSpec
from corral.contracts.registry import decode, encode
from corral.contracts.sizes import recorded_size, size_problem
from corral.contracts.subjects import ADMIN_REQUEST_TYPES, USER_REQUEST_TYPES, Subjects
from corral.eventstore import EventStore, StoredEvent
from corral.readmodel.pages import JobFilter
from corral.stack.context import Context
from corral.stack.credentials import NatsCredentials
from corral.submission_ids import submission_msg_id
from corral.telemetry import tracing
from corral.verdicts import Verdict, read_verdict

if TYPE_CHECKING:
    from corral.bus import Bus
    from corral.projection import ClusterView, JobView

#: The events that answer a submission.
_SUBMISSION_VERDICTS = names((ev.JobAdmitted, ev.JobRejected))


#: The CLI's NATS connection name, which its spans carry as their service (`corral.bus.bus`).
_CLI_CONNECTION = "corral-cli"


class BusUnreachable(ConnectionError):
    """NATS could not be reached when a request was to be published (a `lazy_bus` client)."""


def _user() -> str:
    """Who is asking: $USER, else the login name of this process."""
    import getpass

    try:
        return environment.get("USER") or getpass.getuser()
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

    def __init__(self, ctx: Context, store: EventStore, bus: Bus | None, *, lazy_bus: bool = False,
                 timeout: float = 5.0, blocking: bool = False) -> None:
        self.ctx = ctx
        self.store = store
        self._bus = bus
        self._lazy_bus = lazy_bus
        self._blocking = blocking
        self._timeout = timeout
        self.subjects = Subjects(ctx.namespace)
        self._key: bytes | None = None

    @classmethod
    async def connect(cls, ctx: Context, *, bus: bool = True, timeout: float = 5.0, lazy_bus: bool = False) -> Client:
        """Connect with the context's credential. `lazy_bus`: no NATS connection until a request is
        published, and a request published without nats-py when it can be (`corral.bus.request`):
        a command that publishes one request (`corral submit`). A person with no credential of
        their own goes through the local gateway instead (`corral.cli.session.connect`)."""
        import asyncio

        store = await asyncio.wait_for(EventStore.open(ctx.postgres_dsn, pool_size=4, min_size=1), timeout)
        if lazy_bus:
            tracing.configure(_CLI_CONNECTION)  # its spans carry the CLI's name before the bus is reached
            return cls(ctx, store, None, lazy_bus=True, timeout=timeout)
        nats = None
        if bus:
            try:
                nats = await asyncio.wait_for(cls._connect_bus(ctx), timeout)
            except BaseException:
                await store.close()
                raise
        return cls(ctx, store, nats, timeout=timeout)

    @classmethod
    def blocking(cls, ctx: Context, *, timeout: float = 5.0) -> Client | None:
        """A client for one command-line call with no event loop: Postgres over one blocking
        connection (`EventStore.blocking`), NATS reached only to publish a request, without nats-py
        (`corral.bus.request.send`). Its coroutines never suspend: run them with
        `corral.eventstore.wire.finish`. Only the reads and requests of `submit` (without `--wait`),
        `jobs`, `show` and `cancel` are made to run so. `wire.Unsupported` for a DSN that
        connection does not speak, None with migrations pending: `connect` then."""
        store = EventStore.blocking(ctx.postgres_dsn, timeout)
        if store is None:
            return None
        tracing.configure(_CLI_CONNECTION)  # its spans carry the CLI's name before the bus is reached
        return cls(ctx, store, None, lazy_bus=True, timeout=timeout, blocking=True)

    @staticmethod
    async def _connect_bus(ctx: Context) -> Bus:
        from corral.bus import Bus  # nats-py: loaded only by the commands that publish

        return await Bus.connect(ctx.nats_url, ctx.namespace, name=_CLI_CONNECTION, credentials=ctx.credentials,
                                 ca=ctx.nats_ca)

    async def _connected_bus(self) -> Bus:
        """The bus, connected now if this client was opened with `lazy_bus`; BusUnreachable when
        it cannot be reached within the client's timeout."""
        if self._bus is None and self._lazy_bus:
            import asyncio

            try:
                self._bus = await asyncio.wait_for(self._connect_bus(self.ctx), self._timeout)
            except (TimeoutError, OSError, ConnectionError) as exc:
                raise BusUnreachable(f"{type(exc).__name__}: {exc}") from exc
            except Exception as exc:
                if type(exc).__module__.startswith("nats"):
                    raise BusUnreachable(f"{type(exc).__name__}: {exc}") from exc
                raise
        return self.bus

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
    def max_spec_bytes(self) -> int:
        """The largest job spec the bus takes (`BusLimits.max_spec_bytes`)."""
        if self._bus is None and self._lazy_bus:
            return BusLimits.from_env().max_spec_bytes  # what the bus would have
        return self.bus.limits.max_spec_bytes

    @property
    def identity(self) -> str | None:
        """The NATS identity this client connects as (its context's credentials), if any."""
        if not self.ctx.credentials:
            return None
        return NatsCredentials.load(self.ctx.credentials).user

    @property
    def is_admin(self) -> bool:
        """Whether this client's identity is an admin's: its requests on jobs, queues and nodes go
        to its admin subjects (and are recorded as the admin's)."""
        path = self.ctx.credentials
        if not path:
            return False
        return NatsCredentials.load(path).role == "admin"

    def _request_subject(self, event: Event) -> str:
        """With an identity, a request goes to a subject naming it, which NATS lets it publish only
        under its own name and the services record as the sender (see `corral.bus.auth`): an
        admin's `<ns>.inbox.admin.<admin>.<Type>` for what an admin does (`ADMIN_REQUEST_TYPES`),
        else `<ns>.inbox.user.<user>.<Type>`. Without one (an open bus, the tests' superuser), the
        bare `<ns>.inbox.<Type>`."""
        identity = self.identity
        if identity is not None:
            try:
                if event.type in ADMIN_REQUEST_TYPES and (self.is_admin or event.type not in USER_REQUEST_TYPES):
                    return self.subjects.admin_request(identity, event.type)
                if event.type in USER_REQUEST_TYPES:
                    return self.subjects.user_request(identity, event.type)
            except ValueError:
                pass  # a name that cannot be a subject token: only an open bus takes it
        return self.subjects.inbox(event.type)

    #: How long a request waits out an unavailable bus (a NATS server lost, a stream electing its
    #: leader) before failing: the msg id makes every retry harmless.
    REQUEST_RETRY_SECONDS = 30.0

    async def publish_request(self, event: Event, msg_id: str | None = None) -> None:
        """Publish once; when the inbox's stream is missing (a request racing the services' start),
        declare the streams (or wait for them) and publish again, waiting out an unavailable bus.
        The streams exist nearly always: declaring them first cost a round trip per stream. A
        `lazy_bus` client publishes without nats-py first (`corral.bus.request`), and through the
        bus when that did not get an ack."""
        subject, data, msg_id = self._request_subject(event), encode(event), msg_id or self.msg_id(event)
        headers = {tracing.CORRELATION: event.correlation_id}
        if self._bus is None and self._lazy_bus and not tracing.enabled():
            from corral.bus import request

            sent = (self.ctx.nats_url, subject, data, {**headers, request.MSG_ID: msg_id})
            options = {"credentials": self.ctx.credentials, "ca": self.ctx.nats_ca, "name": _CLI_CONNECTION,
                       "timeout": self._timeout}
            try:
                if self._blocking:
                    request.send(*sent, **options)  # type: ignore[arg-type]
                else:
                    await request.publish(*sent, **options)  # type: ignore[arg-type]
                return
            except request.NotPublished:
                pass  # the bus below says why, or publishes it (the msg id makes that harmless)
        if self._blocking:  # no event loop runs this client: the bus gets one of its own, for this request
            import asyncio

            asyncio.run(self._publish_through_bus(subject, data, msg_id, headers, close=True))
            return
        await self._publish_through_bus(subject, data, msg_id, headers)

    async def _publish_through_bus(self, subject: str, data: bytes, msg_id: str, headers: dict[str, str], *,
                                   close: bool = False) -> None:
        bus = await self._connected_bus()
        from corral.bus import StreamMissing, is_unavailable

        try:
            try:
                await bus.publish(subject, data, msg_id, headers)
                return
            except StreamMissing:
                await bus.ensure_streams()
            except Exception as exc:
                if not is_unavailable(exc):
                    raise
            await bus.publish(subject, data, msg_id, headers, retry_for=self.REQUEST_RETRY_SECONDS)
        finally:
            if close:
                self._bus = None
                await bus.close()

    def submission(self, spec: JobSpec, *, job_id: str | None = None, user: str | None = None) -> ev.JobSubmitted:
        """The JobSubmitted that `submit_request` publishes (checked for size and for what the node
        agent would refuse, `JobSpec.start_problems`; nothing sent)."""
        problems = spec.start_problems()
        if problems:
            raise SpecError(problems)
        job_id = job_id or new_job_id()
        user = user or self.identity or spec.user or _user()
        submitted = ev.JobSubmitted.new(stream=job_stream(job_id), actor=f"user/{user}", correlation_id=job_id,
                                        job_id=job_id, spec=spec, submission_id=spec.submission_id, user=user)
        refuse_oversized(submitted, self.max_spec_bytes)
        return submitted

    async def submit_request(self, spec: JobSpec, *, job_id: str | None = None,
                             user: str | None = None) -> ev.JobSubmitted:
        """Submit a job; returns the request sent (for `await_verdict`)."""
        submitted = self.submission(spec, job_id=job_id, user=user)
        # The root of the job's trace (when tracing is on): every service continues it.
        with tracing.span("corral submit", **{"corral.job_id": submitted.job_id, "corral.queue": spec.queue,
                                              "corral.gpus": spec.total_gpus, "enduser.id": submitted.user or ""}):
            await self.publish_request(submitted)
        return submitted

    async def submit(self, spec: JobSpec, *, job_id: str | None = None, user: str | None = None) -> str:
        """Submit a job; returns its job id (a duplicate submission id's job: see `await_verdict`)."""
        return (await self.submit_request(spec, job_id=job_id, user=user)).job_id

    def msg_id(self, request: Event) -> str:
        """The Nats-Msg-Id a request is published with (JetStream drops a second message with the
        same id within its duplicate window; the owning service's tracking row is keyed by it).
        A request's own event id, but for a submission with a submission id `submission_msg_id`:
        the same for the same user's retries, and another user's never."""
        if isinstance(request, ev.JobSubmitted):
            submission = request.submission_id or request.spec.submission_id
            if submission:
                return submission_msg_id(request.user or "", submission, self._msg_id_key())
        return request.event_id

    def _msg_id_key(self) -> bytes:
        """What keys this identity's submission msg ids: its credentials file (its secret), read
        once; nothing for a client without one (an open bus, where no one has an identity)."""
        if self._key is None:
            try:
                self._key = Path(self.ctx.credentials).read_bytes() if self.ctx.credentials else b""
            except OSError:
                self._key = b""
        return self._key

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
                if stored.type not in _SUBMISSION_VERDICTS:
                    continue
                try:
                    event = decode(stored.data)
                except ContractError:
                    continue
                if isinstance(event, (ev.JobAdmitted, ev.JobRejected)):
                    return event
            if time.monotonic() > deadline:
                return None
            await self.store.pause(interval)
            interval = min(interval * 2, 0.5)

    async def cancel(self, job_id: str, *, user: str | None = None, message: str = "") -> Event:
        """Ask admission to cancel a job. Returns the request (for `await_verdict`)."""
        user = user or self.identity or _user()
        request = ev.JobCancelRequested.new(stream=job_stream(job_id), actor=f"user/{user}", correlation_id=job_id,
                                            job_id=job_id, user=user, message=message or f"cancelled by {user}")
        await self.publish_request(request)
        return request

    async def hold(self, job_id: str, *, release: bool = False, message: str = "") -> Event:
        """Hold a pending job (or, `release=True`, let a held one wait again). Returns the request
        (for `await_verdict`)."""
        user = self.identity or _user()
        kind = ev.JobHoldReleased if release else ev.JobHeld
        request = kind.new(stream=job_stream(job_id), actor=f"user/{user}", correlation_id=job_id,
                           job_id=job_id, user=user, message=message)
        await self.publish_request(request)
        return request

    async def requeue(self, job_id: str, *, message: str = "") -> Event:
        """Ask a running job to checkpoint, stop and wait again. Returns the request (see `hold`)."""
        user = self.identity or _user()
        request = ev.JobRequeueRequested.new(stream=job_stream(job_id), actor=f"user/{user}", correlation_id=job_id,
                                             job_id=job_id, user=user, message=message)
        await self.publish_request(request)
        return request

    async def drain(self, node: str, *, undrain: bool = False, evict: bool = False, message: str = "") -> Event:
        """No new work on `node` (`evict`: its jobs are asked to checkpoint and move), or, with
        `undrain=True`, new work again: an admin's request. Returns the request (see `hold`)."""
        user = self.identity or _user()
        stream, actor = f"node-{node}", f"user/{user}"
        request: Event = (
            ev.NodeUndrained.new(stream=stream, actor=actor, correlation_id=node, node=node, user=user, message=message)
            if undrain else
            ev.NodeDrained.new(stream=stream, actor=actor, correlation_id=node, node=node, user=user, message=message,
                               evict=evict))
        await self.publish_request(request)
        return request

    async def drain_gpu(self, node: str, gpu: int, *, undrain: bool = False, message: str = "") -> Event:
        """No new work on GPU `gpu` of `node` (what runs there goes on), or, with `undrain=True`,
        new work again: an admin's request. Returns the request (see `hold`)."""
        user = self.identity or _user()
        stream, actor = f"node-{node}", f"user/{user}"
        kind = ev.GpuUndrained if undrain else ev.GpuDrained
        request: Event = kind.new(stream=stream, actor=actor, correlation_id=f"{node}:{gpu}", node=node, gpu=gpu,
                                  user=user, message=message)
        await self.publish_request(request)
        return request

    async def await_verdict(self, request: Event, timeout: float) -> Verdict:
        """The owning service's verdict on `request` (`corral.verdicts.read_verdict`): DONE,
        REFUSED (with the reason), UNCHANGED, or NO_VERDICT when none within `timeout` seconds (the
        request waits in the inbox and may still be acted on). A submission answered as a
        duplicate of its user's submission id is answered with the verdict on the job that id
        created (`Verdict.job_id`)."""
        return await read_verdict(self.store, request, self.msg_id(request), timeout)

    async def job_of_submission(self, user: str, submission_id: str) -> str | None:
        """The job `user`'s submission `submission_id` created, if any (an index of the log's
        submissions by user and submission id: migration 075)."""
        return await self.store.job_of_submission(user, submission_id)

    async def apply_queues(self, queues: QueuesFile | Sequence[QueueSpec], *, user: str | None = None,
                           message: str = "", rollback_of: int | None = None) -> list[str]:
        """Ask quota to record a new version of the queue tree: `queues` over the current tree."""
        request = await self.request_queue_tree(queues, user=user, message=message, rollback_of=rollback_of)
        return [spec.name for spec in request.queues]

    async def request_queue_tree(self, queues: QueuesFile | Sequence[QueueSpec], *, user: str | None = None,
                                 message: str = "", rollback_of: int | None = None, gates: Sequence[str] | None = None,
                                 require: Sequence[str] = (), what_if_since: datetime | None = None,
                                 ) -> ev.QueueTreeApplied:
        """`apply_queues`, returning the request sent (for `await_verdict`). Quota decides the
        evidence gate: the standing gates, `gates` (a file's; None: its `gates`, if a QueuesFile)
        and `require`, over the workload recorded since `what_if_since`."""
        user = user or self.identity or _user()
        if isinstance(queues, QueuesFile):  # over the current tree: its parents are not implied anew
            specs = queues.resolved(existing=(await self.live_view(job_ids=[])).queues)
            gates = queues.gates if gates is None else gates
        else:
            specs = list(queues)
        request = ev.QueueTreeApplied.new(stream=QUEUE_TREE_STREAM, actor=f"user/{user}", correlation_id="queues",
                                          queues=specs, user=user, message=message, rollback_of=rollback_of,
                                          gates=None if gates is None else list(gates), require=list(require),
                                          what_if_since=what_if_since)
        await self.publish_request(request)
        return request

    async def replay_dead_letters(self, seq: int | None, timeout: float = 30.0) -> list[dict[str, object]]:
        """Ask a service to republish dead letter `seq` (None: every one) to its original subject;
        one row per dead letter: seq, subject, replayed, message. An admin's request
        (`corral.services.dead_letter_replay`)."""
        import nats.errors  # lazily, as the bus is (a read command never loads nats)

        subject = self.subjects.dead_letter_replay(self.identity or _user())
        body = {"all": True} if seq is None else {"seq": seq}
        try:
            reply = await self.bus.nc.request(subject, json.dumps(body).encode(), timeout=timeout)
        except nats.errors.NoRespondersError:
            raise RuntimeError("no service answered the replay request: is admission running? (and is this "
                               "the admin's login? only an admin may ask)") from None
        rows: list[dict[str, object]] = json.loads(reply.data)
        return rows

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
        from corral.projection import ClusterView  # the fold: loaded by the commands that show jobs

        view = ClusterView()
        for stored, event in await self.events(until=until):
            view.apply(event, stored.version, stored.position)
        return view

    async def live_view(self, *, job_ids: Collection[str] = (), states: Collection[str] = ()) -> ClusterView:
        """The cluster now, from the read model (`corral.readmodel`: the projector's stored view plus
        the log after it): every active job, node and queue, and of the jobs that are over only
        those named in `job_ids` or in one of `states` (`FINISHED`: all of them). O(answer + the
        events since the last snapshot); without a stored view of this code, the whole log."""
        from corral.readmodel.snapshots import read_view

        return await read_view(self.store, job_ids=job_ids, states=states)

    async def nodes_view(self) -> ClusterView:
        """The nodes now, from the read model: every node and queue, and of the jobs only those
        whose released GPUs are still held (`corral.readmodel.snapshots.read_nodes`): what
        `corral nodes` shows, without reading the active jobs."""
        from corral.readmodel.snapshots import read_nodes

        return await read_nodes(self.store)

    async def job(self, job_id: str) -> JobView | None:
        """One job as it is now (None: no such job), from the read model: its row and the log
        after it, whatever the backlog (`corral.readmodel.snapshots.read_job`)."""
        from corral.readmodel.snapshots import read_job

        return await read_job(self.store, job_id)

    async def knows_job(self, job_id: str) -> bool:
        """Whether the log has any event of `job_id` (its stream): what a request about a job
        checks before it is sent, without decoding the job."""
        return await self.store.stream_exists(job_stream(job_id))

    async def jobs_page(self, where: JobFilter, limit: int | None) -> tuple[list[JobView], int]:
        """The first `limit` jobs (None: all) that `where` matches, oldest submission first, and how
        many match: one page of rows of the read model (`corral.readmodel.snapshots.read_page`)."""
        from corral.readmodel.snapshots import read_page

        return await read_page(self.store, where, limit)

    async def wait_for(self, predicate: Callable[[ClusterView], bool], timeout: float,
                       interval: float = 0.2, *, job_ids: Collection[str] | None = None) -> ClusterView:
        """Poll the log until `predicate(view)` holds; TimeoutError with the last view otherwise.

        With `job_ids`, the view starts from the read model (`live_view`) instead of the whole log:
        only those jobs (and the active ones) are whole in it, so `predicate` must look at no other."""
        deadline = time.monotonic() + timeout
        from corral.projection import ClusterView

        view, after = ClusterView(), 0
        if job_ids is not None:
            view = await self.live_view(job_ids=job_ids)
            after = view.position
        while True:
            for stored in await self.store.read_all(after, limit=5000):
                try:
                    # from the read model, in log order: no stream versions (each event comes once)
                    view.apply(decode(stored.data), stored.version if job_ids is None else None, stored.position)
                except ContractError:
                    pass
                after = stored.position
            if predicate(view):
                return view
            if time.monotonic() > deadline:
                raise TimeoutError(f"condition not met within {timeout}s")
            await self.store.pause(interval)
