"""The outbox relay and exactly-once effects, with a real Postgres and a real nats-server."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import pytest

from corral.bus import Bus, Delivery, OutboxRelay, Outgoing, Retry
from corral.bus.limits import BusLimits
from corral.bus.relay import POSITION
from corral.eventstore import ANY, AlreadyProcessed, EventStore, NewEvent, StoredEvent, Tracking
from tests.conftest import Infra


class SimulatedCrash(Exception):
    """Raised by a fault hook: the relay process 'dies' at that point."""


def event(stream: str, type: str = "JobSubmitted", **data: object) -> NewEvent:
    return NewEvent(event_id=str(uuid.uuid4()), stream=stream, type=type, schema_version=1,
                    data=json.dumps(data).encode(), correlation_id=stream, causation_id=None,
                    occurred_at=datetime.now(UTC))


async def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), timeout)


@pytest.fixture
async def store(postgres_dsn: str) -> AsyncIterator[EventStore]:
    s = await EventStore.open(postgres_dsn, poll_interval=0.5)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def bus(infra: Infra) -> AsyncIterator[Bus]:
    b = await Bus.connect(infra.nats_url, namespace=infra.namespace)
    await b.ensure_streams()
    try:
        yield b
    finally:
        await b.close()


def relay(store: EventStore, bus: Bus,
          fault: Callable[[str, StoredEvent], None] | None = None) -> OutboxRelay:
    return OutboxRelay(store, bus, lambda e: bus.names.events_subject(e.type), fault=fault)


class Received:
    def __init__(self) -> None:
        self.msg_ids: list[str | None] = []
        self.positions: list[int] = []

    async def __call__(self, delivery: Delivery) -> None:
        self.msg_ids.append(delivery.msg_id)
        self.positions.append(int(delivery.headers[POSITION]))


async def consume_all(bus: Bus, durable: str = "observer") -> Received:
    received = Received()
    await bus.consume(durable, [bus.names.wildcard("events")], received)
    return received


async def test_a_relay_killed_between_publish_and_save_delivers_the_event_once(
        store: EventStore, bus: Bus) -> None:
    received = await consume_all(bus)
    first = event("job-1")
    await store.append("job-1", 0, [first])

    def kill_after_publish(point: str, e: StoredEvent) -> None:
        if point == "after_publish_before_save":
            raise SimulatedCrash

    with pytest.raises(SimulatedCrash):
        await relay(store, bus, kill_after_publish).publish_pending()
    assert await store.relay_position("relay") == 0  # published, but the position was never saved
    await wait_until(lambda: len(received.msg_ids) == 1)

    restarted = relay(store, bus)
    assert await restarted.publish_pending() == 1  # republished: JetStream drops it as a duplicate
    assert await store.relay_position("relay") == 1
    marker = event("job-2")
    await store.append("job-2", 0, [marker])
    assert await restarted.publish_pending() == 1
    await wait_until(lambda: marker.event_id in received.msg_ids)
    assert received.msg_ids == [first.event_id, marker.event_id]


async def test_an_event_appended_while_the_relay_is_down_is_published_once_on_restart(
        store: EventStore, bus: Bus) -> None:
    received = await consume_all(bus)
    first = relay(store, bus)
    first.start()
    early = event("job-1")
    await store.append("job-1", 0, [early])
    await wait_until(lambda: early.event_id in received.msg_ids)
    await first.stop()

    appended_while_down = event("job-1", "JobAdmitted")
    await store.append("job-1", 1, [appended_while_down])
    second = relay(store, bus)
    second.start()
    try:
        await wait_until(lambda: appended_while_down.event_id in received.msg_ids)
        marker = event("job-2")
        await store.append("job-2", 0, [marker])
        await wait_until(lambda: marker.event_id in received.msg_ids)
    finally:
        await second.stop()
    assert received.msg_ids == [early.event_id, appended_while_down.event_id, marker.event_id]


async def test_a_relay_killed_before_publishing_loses_nothing(store: EventStore, bus: Bus) -> None:
    received = await consume_all(bus)
    events = [event("job-1"), event("job-1", "JobAdmitted"), event("job-1", "JobRunning")]
    await store.append("job-1", 0, events)

    def kill_at_second(point: str, e: StoredEvent) -> None:
        if point == "before_publish" and e.version == 2:
            raise SimulatedCrash

    with pytest.raises(SimulatedCrash):
        await relay(store, bus, kill_at_second).publish_pending()
    await relay(store, bus).publish_pending()
    await wait_until(lambda: len(received.msg_ids) >= 3)
    assert received.msg_ids == [e.event_id for e in events]


async def test_a_running_relay_publishes_concurrent_appends_in_position_order(
        store: EventStore, bus: Bus) -> None:
    received = await consume_all(bus)
    running = relay(store, bus)
    running.start()

    async def writer(stream: str) -> None:
        for _ in range(10):
            await store.append(stream, ANY, [event(stream), event(stream, "JobAdmitted")])

    try:
        await asyncio.gather(*(writer(f"job-{i}") for i in range(8)))
        await wait_until(lambda: len(received.positions) >= 160, timeout=20)
    finally:
        await running.stop()
    assert received.positions == list(range(1, 161))
    assert len(set(received.msg_ids)) == 160


async def test_tracking_gives_a_redelivered_message_exactly_one_effect(store: EventStore, bus: Bus) -> None:
    """The consumer commits its effect, then 'crashes' before acking: the redelivery is a no-op."""
    subject = bus.names.events_subject("JobSubmitted")
    outcomes: list[object] = []

    async def admit(delivery: Delivery) -> None:
        assert delivery.msg_id is not None
        job = json.loads(delivery.data)["job"]
        admitted = event(f"job-{job}", "JobAdmitted", job=job)
        result = await store.append(f"job-{job}", ANY, [admitted],
                                    tracking=Tracking("admission", delivery.msg_id))
        outcomes.append(result)
        if delivery.delivery_count == 1:
            raise Retry("simulated crash after commit, before ack", delay=0.05)

    await bus.consume("admission", [subject], admit)
    await bus.publish(subject, b'{"job": 7}', msg_id="submit-7")
    await wait_until(lambda: len(outcomes) == 2)
    assert outcomes == [1, AlreadyProcessed("admission", "submit-7")]
    assert [e.type for e in await store.read_stream("job-7")] == ["JobAdmitted"]
    assert await store.was_processed("admission", "submit-7")


async def test_relay_publishes_event_metadata_in_headers(store: EventStore, bus: Bus) -> None:
    headers: list[dict[str, str]] = []

    async def keep(delivery: Delivery) -> None:
        headers.append(dict(delivery.headers))

    await bus.consume("meta", [bus.names.events_subject("JobAdmitted")], keep)
    await store.append("job-1", 0, [event("job-1", "JobAdmitted")])
    await relay(store, bus).publish_pending()
    await wait_until(lambda: len(headers) == 1)
    assert headers[0]["Corral-Stream"] == "job-1"
    assert headers[0]["Corral-Stream-Version"] == "1"
    assert headers[0]["Corral-Correlation-Id"] == "job-1"


async def test_an_event_the_bus_refuses_for_its_size_is_skipped_with_an_alert(infra: Infra, store: EventStore) -> None:
    """The stream takes 64 KiB; this relay's bus believes 1 MiB (a config mismatch): the server's
    refusal is recognised, the event is skipped with an EventNotRelayed, and the next one goes."""
    small = BusLimits(max_event_bytes=64 * 1024, max_spec_bytes=32 * 1024)
    async with await Bus.connect(infra.nats_url, infra.namespace, limits=small) as declaring:
        await declaring.ensure_streams()
    async with await Bus.connect(infra.nats_url, infra.namespace, limits=BusLimits()) as bus:
        received = Received()
        await bus.consume("reader", [bus.names.events_subject("JobSubmitted")], received)
        big = event("job-big", blob="x" * 100_000)
        await store.append("job-big", 0, [big])
        await store.append("job-next", 0, [event("job-next")])
        assert await relay(store, bus).publish_pending() == 3  # the two, then the alert itself
        alerts = [e for e in await store.read_all(0) if e.type == "EventNotRelayed"]
        assert len(alerts) == 1 and alerts[0].stream == "cluster"
        alert = json.loads(alerts[0].data)
        assert alert["event_id_skipped"] == big.event_id and alert["reason"]["code"] == "EVENT_TOO_LARGE"
        await wait_until(lambda: len(received.positions) == 1)
        assert received.positions == [2], "the big event (position 1) skipped, the next one relayed"
        assert await store.relay_position("relay") >= 2


async def test_a_relay_whose_bus_lost_what_it_acknowledged_publishes_it_again(store: EventStore, bus: Bus) -> None:
    """JetStream fsyncs once a second (`NatsServer.sync_interval`): a crash of its machine can lose
    the stream's last second after the relay saved it as published. The relay starts after the
    newest event the bus still holds, so the lost tail reaches the consumers, in order."""
    received = await consume_all(bus)
    kept = event("job-1")
    await store.append("job-1", 0, [kept])
    assert await relay(store, bus).publish_pending() == 1
    lost = [event("job-1", "JobAdmitted"), event("job-1", "JobRunning")]
    await store.append("job-1", 1, lost)
    await store.save_relay_position("relay", 3)  # acknowledged, then lost with the machine

    assert await relay(store, bus).publish_pending() == 2
    await wait_until(lambda: len(received.msg_ids) == 3)
    assert received.msg_ids == [kept.event_id, *(e.event_id for e in lost)]
    assert received.positions == [1, 2, 3]
    assert await relay(store, bus).publish_pending() == 0  # the bus holds it all now


async def test_a_relay_given_types_publishes_only_those_and_resumes_past_a_tail_of_others(
        store: EventStore, bus: Bus, caplog: pytest.LogCaptureFixture) -> None:
    """The services' relay publishes the types some process is sent (`relayed_types`): a log whose
    tail is of other types is not taken for a bus that lost what it acknowledged."""
    received = await consume_all(bus)
    types = {"JobSubmitted", "JobCompleted"}
    job = [event("job-1"), event("job-1", "WorkerStarted"), event("job-1", "JobCompleted"),
           event("job-1", "WorkerExited"), event("job-1", "GpusReleased")]
    await store.append("job-1", 0, job)

    def typed() -> OutboxRelay:
        return OutboxRelay(store, bus, lambda e: bus.names.events_subject(e.type), types=types)

    assert await typed().publish_pending() == 5
    await wait_until(lambda: len(received.positions) == 2)
    assert received.positions == [1, 3]
    assert await store.relay_position("relay") == 5
    with caplog.at_level(logging.WARNING, logger="corral.bus.relay"):
        assert await typed().resume_position() == 5
    assert not [r for r in caplog.records if "publishing again" in r.getMessage()]
    # the bus lost position 3 (a crash of its machine): the relay publishes again from it
    await bus.js.purge_stream(bus.names.stream("events"))
    await bus.publish_many([Outgoing(bus.names.events_subject("JobSubmitted"), job[0].data, "again",
                                     {POSITION: "1"})])
    assert await typed().resume_position() == 2


async def test_a_message_another_publisher_stored_inside_a_batch_does_not_stop_the_relay(
        store: EventStore, bus: Bus) -> None:
    """The relay's batch is chained (`corral.bus.relay.chained`); a message someone else published
    between two of the batch's breaks that chain on every try of the batch, so the relay sends it
    one message at a time instead."""
    events = [event("job-1"), event("job-1", "JobAdmitted"), event("job-1", "QuotaReserved")]
    await store.append("job-1", 0, events)
    # a relay that died after the first event reached the bus, then a message published by hand
    await bus.publish_many([Outgoing(bus.names.events_subject("JobSubmitted"), b"{}", events[0].event_id)])
    await bus.publish(bus.names.events_subject("JobRequeued"), b"{}", "by-hand")

    assert await asyncio.wait_for(relay(store, bus).publish_pending(), 20) == 3
    stream = bus.names.stream("events")
    last = (await bus.js.stream_info(stream)).state.last_seq
    ids = [(await bus.js.get_msg(stream, seq)).headers.get("Nats-Msg-Id") for seq in range(1, last + 1)]
    assert ids == [events[0].event_id, "by-hand", events[1].event_id, events[2].event_id]


async def test_a_relay_saving_every_while_saves_its_position_soon_after_and_on_stopping(
        store: EventStore, bus: Bus) -> None:
    """`save_every`: the position is saved a while after a batch, not with each; a relay that stops
    saves what it saw acknowledged, and one killed before its save publishes the rest once more,
    which the bus drops as duplicates."""
    received = await consume_all(bus)
    saves: list[int] = []
    follower = OutboxRelay(store, bus, lambda e: bus.names.events_subject(e.type), save_every=0.3,
                           fault=lambda point, e: saves.append(e.position) if point == "after_save" else None)
    follower.start()
    try:
        for i in range(3):
            await store.append(f"job-{i}", 0, [event(f"job-{i}")])
            await wait_until(lambda i=i: len(received.msg_ids) == i + 1)
        await wait_until(lambda: saves[-1:] == [3])
        assert saves == sorted(saves)
        await store.append("job-3", 0, [event("job-3")])
        await wait_until(lambda: len(received.msg_ids) == 4)
    finally:
        await follower.stop()
    assert await store.relay_position("relay") == 4  # saved on stopping, before its while was over

    killed = OutboxRelay(store, bus, lambda e: bus.names.events_subject(e.type), save_every=60)
    killed.start()
    await store.append("job-4", 0, [event("job-4")])
    await wait_until(lambda: len(received.msg_ids) == 5)
    killed._unsaved = None  # as after a kill -9: the position is never saved
    await killed.stop()
    assert await store.relay_position("relay") == 4
    assert await relay(store, bus).publish_pending() == 1  # published again, dropped as a duplicate
    await store.append("job-5", 0, [marker := event("job-5")])
    assert await relay(store, bus).publish_pending() == 1
    await wait_until(lambda: marker.event_id in received.msg_ids)
    assert len(received.msg_ids) == len(set(received.msg_ids)) == 6
