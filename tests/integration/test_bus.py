"""The JetStream bus against a real nats-server: streams, dedup, ack/retry/dead-letter, clean stop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import nats.errors
import nats.js.errors
import pytest

from corral.bus import (
    DUPLICATE_WINDOW,
    Bus,
    Delivery,
    Outgoing,
    Poison,
    Retry,
    StreamMissing,
    Unavailable,
    UnavailableBackoff,
)
from corral.bus.delivery import DLQ_CONSUMER, DLQ_DELIVERIES, DLQ_ERROR, DLQ_SEQUENCE, DLQ_SUBJECT


async def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), timeout)


class Inbox:
    """Collects what a consumer's handler receives."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []

    async def __call__(self, delivery: Delivery) -> None:
        self.deliveries.append(delivery)

    def subjects(self) -> list[str]:
        return [d.subject for d in self.deliveries]


async def test_streams_are_declared_idempotently_under_the_namespace(bus: Bus, namespace: str) -> None:
    await bus.ensure_streams()  # a second declaration changes nothing and does not fail
    ns = namespace.upper()
    for kind in ("events", "inbox", "dlq"):
        info = await bus.js.stream_info(f"{ns}_{kind.upper()}")
        expected = bus.inbox_subjects() if kind == "inbox" else [f"{namespace}.{kind}.>"]
        assert info.config.subjects == expected
        assert info.config.duplicate_window == DUPLICATE_WINDOW
    assert bus.names.events_subject("JobSubmitted") == f"{namespace}.events.JobSubmitted"
    # one durable per node agent: a thousand hosts are more than nats-server's default of 1,000 a stream
    events = await bus.js.stream_info(f"{ns}_EVENTS")
    assert events.config.max_consumers == bus.limits.events_max_consumers >= 10_000


async def test_publishing_the_same_event_twice_is_delivered_once(bus: Bus) -> None:
    subject = bus.names.events_subject("JobSubmitted")
    first = await bus.publish(subject, b'{"n": 1}', msg_id="evt-1")
    second = await bus.publish(subject, b'{"n": 1}', msg_id="evt-1")
    assert (first.duplicate, second.duplicate) == (False, True)
    assert second.sequence == first.sequence
    inbox = Inbox()
    await bus.consume("admission", [subject], inbox)
    await bus.publish(subject, b'{"n": 2}', msg_id="evt-2")  # a marker: after it, nothing else can come
    await wait_until(lambda: len(inbox.deliveries) >= 2)
    assert [d.msg_id for d in inbox.deliveries] == ["evt-1", "evt-2"]
    assert inbox.deliveries[0].delivery_count == 1


async def test_a_consumer_reads_several_subjects_of_one_stream(bus: Bus) -> None:
    submitted, cancelled = bus.names.events_subject("JobSubmitted"), bus.names.events_subject("JobCancelled")
    inbox = Inbox()
    await bus.consume("jobs", [submitted, cancelled], inbox)
    await bus.publish(bus.names.events_subject("NodeHeartbeat"), b"{}", msg_id="h")
    await bus.publish(cancelled, b"{}", msg_id="c")
    await bus.publish(submitted, b"{}", msg_id="s")
    await wait_until(lambda: len(inbox.deliveries) >= 2)
    assert inbox.subjects() == [cancelled, submitted]
    with pytest.raises(ValueError, match="several streams"):
        await bus.consume("mixed", [submitted, bus.names.inbox_subject("JobSubmitted")], inbox)


async def test_a_retried_message_is_redelivered_after_backoff_until_it_succeeds(bus: Bus) -> None:
    subject = bus.names.inbox_subject("QueueConfigured")
    counts: list[int] = []

    async def flaky(delivery: Delivery) -> None:
        counts.append(delivery.delivery_count)
        if delivery.delivery_count < 3:
            raise Retry("database busy")

    consumer = await bus.consume("quota", [subject], flaky, backoff=[0.05, 0.1])
    await bus.publish(subject, b"{}", msg_id="m1")
    await wait_until(lambda: len(counts) >= 3)
    await consumer.stop()  # settles the third delivery first
    assert counts == [1, 2, 3]
    info = await bus.js.consumer_info(bus.names.stream("inbox"), "quota")
    assert info.num_ack_pending == 0 and info.num_redelivered == 0


async def dead_letters(bus: Bus, durable: str) -> Inbox:
    """What consumer `durable` dead-lettered (the consumer is in the headers)."""
    inbox = Inbox()

    async def mine(delivery: Delivery) -> None:
        if delivery.headers.get(DLQ_CONSUMER) == durable:
            inbox.deliveries.append(delivery)

    await bus.consume(f"dlq-reader-{durable}", [bus.names.wildcard("dlq")], mine)
    return inbox


async def test_a_poison_message_is_dead_lettered_at_once(bus: Bus) -> None:
    subject = bus.names.events_subject("JobSubmitted")
    calls: list[int] = []

    async def refuse(delivery: Delivery) -> None:
        calls.append(delivery.delivery_count)
        raise Poison("gpu count must be > 0")

    dlq = await dead_letters(bus, "admission")
    await bus.consume("admission", [subject], refuse)
    published = await bus.publish(subject, b'{"gpus": 0}', msg_id="bad-1", headers={"X-Trace": "t1"})
    await wait_until(lambda: len(dlq.deliveries) == 1)
    letter = dlq.deliveries[0]
    assert letter.data == b'{"gpus": 0}'
    assert letter.subject == bus.names.dead_letter_subject(bus.names.stream("events"), published.sequence)
    assert letter.headers[DLQ_SUBJECT] == subject
    assert letter.headers[DLQ_SEQUENCE] == str(published.sequence)
    assert letter.headers[DLQ_CONSUMER] == "admission"
    assert "gpu count must be > 0" in letter.headers[DLQ_ERROR]
    assert letter.headers["X-Trace"] == "t1"
    assert calls == [1]


async def test_a_message_failing_every_delivery_is_dead_lettered_after_max_deliver(bus: Bus) -> None:
    subject = bus.names.events_subject("JobSubmitted")
    calls: list[int] = []

    async def broken(delivery: Delivery) -> None:
        calls.append(delivery.delivery_count)
        raise KeyError("a bug")

    dlq = await dead_letters(bus, "placement")
    await bus.consume("placement", [subject], broken, max_deliver=3, backoff=[0.01])
    await bus.publish(subject, b"{}", msg_id="e1")
    await wait_until(lambda: len(dlq.deliveries) == 1)
    assert calls == [1, 2, 3]
    assert dlq.deliveries[0].headers[DLQ_DELIVERIES] == "3"
    assert "KeyError" in dlq.deliveries[0].headers[DLQ_ERROR]
    assert "\n" not in dlq.deliveries[0].headers[DLQ_ERROR]


async def test_a_message_whose_handler_never_returned_is_dead_lettered_past_the_limit(bus: Bus) -> None:
    """A handler that kills its process never gets to dead-letter; the next consumer does."""
    subject = bus.names.inbox_subject("WorkerExited")
    started = asyncio.Event()

    async def hangs(delivery: Delivery) -> None:
        started.set()
        await asyncio.Event().wait()

    dlq = await dead_letters(bus, "agent")
    crashed = await bus.consume("agent", [subject], hangs, max_deliver=1, ack_wait=0.5)
    await bus.publish(subject, b"{}", msg_id="a1")
    await asyncio.wait_for(started.wait(), 5)
    crashed.task.cancel()  # the process dies mid-handling: no ack, no nak
    calls: list[int] = []

    async def records(delivery: Delivery) -> None:
        calls.append(delivery.delivery_count)

    await bus.consume("agent", [subject], records, max_deliver=1, ack_wait=0.5)
    await wait_until(lambda: len(dlq.deliveries) == 1)
    assert calls == []
    assert "delivery limit 1 exceeded" in dlq.deliveries[0].headers[DLQ_ERROR]


async def test_stop_finishes_the_message_in_hand_then_ends(bus: Bus) -> None:
    subject = bus.names.inbox_subject("WorkerStarted")
    release, started, done = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def slow(delivery: Delivery) -> None:
        started.set()
        await release.wait()
        done.set()

    consumer = await bus.consume("slow", [subject], slow)
    await bus.publish(subject, b"{}", msg_id="s1")
    await asyncio.wait_for(started.wait(), 5)
    stopping = asyncio.create_task(consumer.stop())
    await asyncio.sleep(0.05)
    assert not stopping.done()
    release.set()
    await asyncio.wait_for(stopping, 5)
    assert done.is_set()
    info = await bus.js.consumer_info(bus.names.stream("inbox"), "slow")
    assert info.num_ack_pending == 0


async def test_an_idle_consumer_stops_at_once(bus: Bus) -> None:
    consumer = await bus.consume("idle", [bus.names.inbox_subject("CheckpointDone")], Inbox())
    await asyncio.sleep(0.1)
    await asyncio.wait_for(consumer.stop(), 1)
    assert consumer.task.done()


async def test_subjects_outside_the_namespace_are_refused(bus: Bus) -> None:
    with pytest.raises(ValueError, match="not under namespace"):
        await bus.publish("other.events.JobSubmitted", b"{}", msg_id="x")
    with pytest.raises(ValueError, match="msg_id"):
        await bus.publish(bus.names.events_subject("JobSubmitted"), b"{}", msg_id="")


async def test_a_pipelined_batch_is_stored_in_order_and_deduplicated(bus: Bus) -> None:
    subject = bus.names.events_subject("NodeRegistered")
    batch = [Outgoing(subject, f'{{"n": {i}}}'.encode(), msg_id=f"n{i}") for i in range(50)]
    first = await bus.publish_many(batch)
    again = await bus.publish_many(batch[40:])
    assert [p.sequence for p in first] == list(range(1, 51))
    assert all(p.duplicate for p in again) and not any(p.duplicate for p in first)


async def test_publishing_before_the_streams_exist_says_how_to_fix_it(nats_url: str, namespace: str) -> None:
    async with await Bus.connect(nats_url, namespace=namespace) as fresh:
        subject = fresh.names.inbox_subject("JobSubmitted")
        with pytest.raises(StreamMissing, match="ensure_streams"):
            await fresh.publish(subject, b"{}", msg_id="x")
        with pytest.raises(StreamMissing, match="ensure_streams"):
            await fresh.publish_many([Outgoing(subject, b"{}", "y")])


async def test_an_unavailable_dependency_holds_the_message_without_counting_or_dead_lettering(bus: Bus) -> None:
    subject = bus.names.inbox_subject("JobSubmitted")
    calls: list[int] = []

    async def database_down_three_times(delivery: Delivery) -> None:
        calls.append(delivery.delivery_count)
        if len(calls) <= 3:
            raise ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 5432)")

    dlq = await dead_letters(bus, "admission-inbox")
    consumer = await bus.consume("admission-inbox", [subject], database_down_three_times, max_deliver=1,
                                 unavailable_backoff=UnavailableBackoff(first=0.05, cap=0.1))
    await bus.publish(subject, b"{}", msg_id="s1")
    await bus.publish(subject, b"{}", msg_id="s2")
    await wait_until(lambda: len(calls) >= 5)
    await consumer.stop()
    assert calls == [1, 1, 1, 1, 1], "held, not redelivered: the delivery count never grows"
    assert dlq.deliveries == [], "max_deliver=1, yet nothing is dead-lettered: the input was never the problem"
    info = await bus.js.consumer_info(bus.names.stream("inbox"), "admission-inbox")
    assert info.num_ack_pending == 0 and info.num_redelivered == 0 and info.num_pending == 0


async def test_a_batch_holds_only_what_met_the_outage_and_settles_the_rest(bus: Bus) -> None:
    subject = bus.names.inbox_subject("WorkerExited")
    seen: list[str] = []

    async def batch(deliveries: list[Delivery]) -> list[BaseException | None]:
        seen.extend(d.msg_id or "" for d in deliveries)
        outcomes: list[BaseException | None] = []
        for d in deliveries:
            if d.msg_id == "poison":
                outcomes.append(Poison("bad report"))
            elif d.msg_id == "slow-db" and seen.count("slow-db") <= 2:
                outcomes.append(Unavailable("event store down"))
            else:
                outcomes.append(None)
        return outcomes

    dlq = await dead_letters(bus, "placement-inbox")
    for msg_id in ("ok", "poison", "slow-db"):
        await bus.publish(subject, b"{}", msg_id=msg_id)
    consumer = await bus.consume("placement-inbox", [subject], Inbox(), batch=8, max_deliver=1,
                                 batch_handler=batch, unavailable_backoff=UnavailableBackoff(first=0.05, cap=0.1))
    await wait_until(lambda: seen.count("slow-db") >= 3 and len(dlq.deliveries) == 1)
    await consumer.stop()
    assert sorted(seen) == ["ok", "poison", "slow-db", "slow-db", "slow-db"]
    assert [d.headers[DLQ_ERROR] for d in dlq.deliveries] == ["poison: bad report"]
    info = await bus.js.consumer_info(bus.names.stream("inbox"), "placement-inbox")
    assert info.num_ack_pending == 0 and info.num_redelivered == 0


async def test_json_log_lines_logged_while_handling_a_message_carry_its_job(bus: Bus) -> None:
    """The consumer sets the job being handled (`corral.telemetry.logs.handling`), so a
    handler's line that does not name the job still carries its id, one message or a batch."""
    import json
    import logging

    from corral.telemetry import logs

    lines: list[dict[str, str]] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(json.loads(formatter.format(record)))

    formatter = logs.JsonFormatter("test")
    log = logging.getLogger("corral.test.handling")
    log.addHandler(capture := Capture())
    log.setLevel(logging.INFO)

    async def handler(delivery: Delivery) -> None:
        log.info("handling %s", delivery.subject)

    async def batch_handler(deliveries: list[Delivery]) -> list[BaseException | None]:
        log.info("handling %d", len(deliveries))
        return [None] * len(deliveries)

    try:
        one, batch = bus.names.events_subject("GangReserved"), bus.names.events_subject("JobSubmitted")
        await bus.publish(one, b"{}", msg_id="e1", headers={"Corral-Stream": "job-j01kbx2m3n4p5qr"})
        await bus.publish(batch, b'{"type":"JobSubmitted","job_id":"train-7"}', msg_id="e2")
        await bus.consume("one", [one], handler)
        await bus.consume("batch", [batch], handler, batch_handler=batch_handler)
        await wait_until(lambda: len(lines) >= 2)
    finally:
        log.removeHandler(capture)
    assert sorted((line["message"], line["job_id"]) for line in lines) == [
        ("handling 1", "train-7"), (f"handling {one}", "j01kbx2m3n4p5qr")]


async def test_declaring_streams_waits_out_an_unavailable_jetstream(nats_url: str, namespace: str) -> None:
    """CI: a service started beside a 3-server cluster that was still electing crashed in
    `ensure_streams` (`update_stream` timed out). The server here is real; its first two answers
    are replaced by what a forming cluster says (a 503, then a timeout)."""
    b = await Bus.connect(nats_url, namespace=namespace)
    try:
        real_add = b.js.add_stream
        faults: list[BaseException] = [
            nats.js.errors.ServiceUnavailableError(code=503, err_code=10023, description="insufficient resources"),
            nats.errors.TimeoutError()]

        async def add_stream(config: Any, **kwargs: Any) -> Any:
            if faults:
                raise faults.pop(0)
            return await real_add(config, **kwargs)

        b.js.add_stream = add_stream  # type: ignore[method-assign]
        await asyncio.wait_for(b.ensure_streams(), 20)
        assert not faults
        assert (await b.js.stream_info(b.names.stream("events"))).config.subjects == [f"{namespace}.events.>"]
    finally:
        await b.close()
