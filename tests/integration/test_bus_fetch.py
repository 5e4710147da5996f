"""A pull consumer's fetch with `corral.bus.client.Subscription` against a real nats-server: the
same messages in the same order as nats-py's, queued ones handed over without a task each."""

from __future__ import annotations

import asyncio
import json

import nats.errors
import pytest
from nats.aio.subscription import Subscription as NatsSubscription
from nats.js.api import AckPolicy, ConsumerConfig

from corral.bus import Bus
from corral.bus.client import Subscription


async def _pull(bus: Bus, name: str) -> tuple[str, object]:
    subject = bus.names.events_subject("JobAdmitted")
    stream = bus.names.stream_for([subject])
    await bus.js.add_consumer(stream, ConsumerConfig(durable_name=name, ack_policy=AckPolicy.EXPLICIT,
                                                     filter_subject=subject))
    return subject, await bus.js.pull_subscribe_bind(durable=name, stream=stream)


async def test_a_batch_comes_whole_and_in_order(bus: Bus) -> None:
    subject, psub = await _pull(bus, "fetch-order")
    assert type(psub._sub) is Subscription  # type: ignore[attr-defined]
    for i in range(300):
        await bus.js.publish(subject, f"{i}".encode())
    got: list[int] = []
    while len(got) < 300:
        msgs = await psub.fetch(128, timeout=2.0)  # type: ignore[attr-defined]
        for msg in msgs:
            await msg.ack()
        got.extend(int(m.data) for m in msgs)
    assert got == list(range(300))
    assert psub._sub.pending_bytes == 0  # type: ignore[attr-defined]  # what nats-py's next_msg keeps


async def test_queued_messages_are_handed_over_without_a_task_each(bus: Bus) -> None:
    subject, psub = await _pull(bus, "fetch-tasks")
    for i in range(200):
        await bus.js.publish(subject, f"{i}".encode())
    sub = psub._sub  # type: ignore[attr-defined]
    # a pull request for 150, its messages left queued on the subscription (as `fetch` sends it)
    await bus.nc.publish(psub._nms, json.dumps({"batch": 150, "no_wait": True}).encode(),  # type: ignore[attr-defined]
                         psub._deliver)  # type: ignore[attr-defined]
    while sub._pending_queue.qsize() < 150:
        await asyncio.sleep(0.01)
    created: list[object] = []
    loop = asyncio.get_running_loop()
    original = loop.create_task

    def counting(*args: object, **kwargs: object) -> asyncio.Task[object]:
        created.append(args[0])
        return original(*args, **kwargs)  # type: ignore[arg-type]

    loop.create_task = counting  # type: ignore[method-assign, assignment]
    try:
        msgs = [await sub.next_msg(timeout=1.0) for _ in range(150)]
    finally:
        loop.create_task = original  # type: ignore[method-assign]
    assert [int(m.data) for m in msgs] == list(range(150))
    assert not created, f"{len(created)} tasks for 150 queued messages"


async def test_an_empty_queue_waits_and_times_out_as_nats_py_does(bus: Bus) -> None:
    _, psub = await _pull(bus, "fetch-empty")
    with pytest.raises(nats.errors.TimeoutError):
        await psub.fetch(16, timeout=0.2)  # type: ignore[attr-defined]
    await psub.unsubscribe()  # type: ignore[attr-defined]  # else closing the bus drains it for 30 s


async def test_callback_subscriptions_keep_nats_py_s_class(bus: Bus) -> None:
    async def cb(msg: object) -> None:
        return None

    sub = await bus.nc.subscribe(bus.names.events_subject("JobAdmitted"), cb=cb)
    try:
        assert type(sub) is NatsSubscription
    finally:
        await sub.unsubscribe()
