"""A `Client` for the command functions' unit tests: the log in memory, requests recorded instead
of published, the owning service's verdict chosen by the test. No NATS, no Postgres."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from typing import Any

from corral.contracts import events as ev
from corral.contracts.envelope import QUEUE_TREE_STREAM, Event, job_stream
from corral.contracts.queues import QueueSpec
from corral.contracts.registry import encode
from corral.eventstore.records import StoredEvent
from corral.projection import ClusterView, JobView
from corral.verdicts import Verdict, VerdictKind


class FakeStore:
    def __init__(self, log: list[StoredEvent]) -> None:
        self.log = log

    async def read_all(self, after: int, limit: int = 1000, types: Collection[str] | None = None) -> list[StoredEvent]:
        return [s for s in self.log if s.position > after and (not types or s.type in types)][:limit]

    async def head_position(self) -> int:
        return self.log[-1].position if self.log else 0


class FakeClient:
    """The `Client` methods the commands call. `answer` is the verdict every request gets (DONE
    records the request in the log, as its owner would); `sent` lists the requests."""

    def __init__(self, events: Iterable[Event] = (), answer: VerdictKind = VerdictKind.DONE,
                 dead_letters: Sequence[dict[str, Any]] | Exception = ()) -> None:
        self.log: list[StoredEvent] = []
        self.store = FakeStore(self.log)
        self.sent: list[Event] = []
        self.answer = answer
        self.dead_letters = dead_letters
        for e in events:
            self.append(e)

    def append(self, event: Event) -> StoredEvent:
        version = sum(1 for s in self.log if s.stream == event.stream) + 1
        stored = StoredEvent(event_id=event.event_id, stream=event.stream, type=event.type, schema_version=1,
                             data=encode(event), correlation_id=event.correlation_id, causation_id=None,
                             occurred_at=event.occurred_at, version=version, position=len(self.log) + 1,
                             recorded_at=event.occurred_at)
        self.log.append(stored)
        return stored

    async def close(self) -> None:
        pass

    # ---- the log ----
    async def events(self, *, after: int = 0, until: datetime | None = None,
                     types: list[str] | None = None) -> list[tuple[StoredEvent, Event]]:
        from corral.contracts.registry import decode

        return [(s, decode(s.data)) for s in self.log if s.position > after
                and (until is None or s.recorded_at <= until) and (not types or s.type in types)]

    async def job_events(self, job_id: str) -> list[tuple[StoredEvent, Event]]:
        return [(s, e) for s, e in await self.events() if s.stream == job_stream(job_id)]

    async def view(self, until: datetime | None = None) -> ClusterView:
        view = ClusterView()
        for stored, event in await self.events(until=until):
            view.apply(event, stored.version, stored.position)
        return view

    async def live_view(self, *, job_ids: Collection[str] = (), states: Collection[str] = ()) -> ClusterView:
        return await self.view()

    async def nodes_view(self) -> ClusterView:
        return await self.view()

    async def job(self, job_id: str) -> JobView | None:
        return (await self.view()).jobs.get(job_id)

    # ---- requests ----
    async def _send(self, request: Event) -> Event:
        self.sent.append(request)
        return request

    async def cancel(self, job_id: str, *, message: str = "") -> Event:
        return await self._send(ev.JobCancelRequested.new(stream=job_stream(job_id), actor="user/op",
                                                          correlation_id=job_id, job_id=job_id, user="op",
                                                          message=message or "cancelled by op"))

    async def hold(self, job_id: str, *, release: bool = False, message: str = "") -> Event:
        kind = ev.JobHoldReleased if release else ev.JobHeld
        return await self._send(kind.new(stream=job_stream(job_id), actor="user/op", correlation_id=job_id,
                                         job_id=job_id, user="op", message=message))

    async def requeue(self, job_id: str, *, message: str = "") -> Event:
        return await self._send(ev.JobRequeueRequested.new(stream=job_stream(job_id), actor="user/op",
                                                           correlation_id=job_id, job_id=job_id, user="op",
                                                           message=message))

    async def drain(self, node: str, *, undrain: bool = False, evict: bool = False, message: str = "") -> Event:
        if undrain:
            return await self._send(ev.NodeUndrained.new(stream=f"node-{node}", actor="user/op", correlation_id=node,
                                                         node=node, user="op", message=message))
        return await self._send(ev.NodeDrained.new(stream=f"node-{node}", actor="user/op", correlation_id=node,
                                                   node=node, user="op", message=message, evict=evict))

    async def drain_gpu(self, node: str, gpu: int, *, undrain: bool = False, message: str = "") -> Event:
        kind = ev.GpuUndrained if undrain else ev.GpuDrained
        return await self._send(kind.new(stream=f"node-{node}", actor="user/op", correlation_id=f"{node}:{gpu}",
                                         node=node, gpu=gpu, user="op", message=message))

    async def request_queue_tree(self, queues: Sequence[QueueSpec], *, message: str = "",
                                 rollback_of: int | None = None, gates: Sequence[str] | None = None,
                                 require: Sequence[str] = (), what_if_since: datetime | None = None,
                                 ) -> ev.QueueTreeApplied:
        request = ev.QueueTreeApplied.new(stream=QUEUE_TREE_STREAM, actor="user/op", correlation_id="queues",
                                          queues=list(queues), user="op", message=message, rollback_of=rollback_of,
                                          gates=None if gates is None else list(gates), require=list(require),
                                          what_if_since=what_if_since)
        await self._send(request)
        return request

    async def await_verdict(self, request: Event, timeout: float) -> Verdict:
        if self.answer is not VerdictKind.DONE:
            return Verdict(request, self.answer)
        stored = self.append(request)
        return Verdict(request, VerdictKind.DONE, event=request, version=stored.version)

    async def replay_dead_letters(self, seq: int | None) -> list[dict[str, Any]]:
        if isinstance(self.dead_letters, Exception):
            raise self.dead_letters
        return [d for d in self.dead_letters if seq is None or d["seq"] == seq]


def run(coro: Any) -> Any:
    import asyncio

    return asyncio.run(coro)
