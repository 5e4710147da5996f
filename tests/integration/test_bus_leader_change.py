"""The bus across the loss of the nats-server that leads a stream: consumers and publishers go on.

Why: a 3-server JetStream cluster elects a new leader for each stream and consumer the lost server
led; meanwhile the servers answer 503s, "no responders" and timeouts. Every such answer is a
dependency to wait out: a consumer that stops fetching, or a publisher that gives up on the first
refusal, leaves jobs unstarted for good while the log says nothing. Real servers (three
nats-server processes on loopback, `tests.nats_cluster`), streams with three replicas as deployed.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import time
from collections.abc import AsyncIterator

import pytest

import tests.nats_cluster as helper
from corral.bus import Bus, Delivery, Outgoing, is_unavailable
from corral.bus.auth import nats_authorization, superuser
from corral.bus.limits import BusLimits
from corral.bus.naming import EVENTS
from tests.nats_cluster import NatsCluster


@pytest.fixture
async def cluster() -> AsyncIterator[NatsCluster]:
    password = secrets.token_urlsafe(16)
    nats = NatsCluster(nats_authorization([superuser("corral-test", password)]), "corral-test", password).start()
    try:
        await nats.wait_ready(timeout=60)
        yield nats
    finally:
        nats.stop()


async def publish_until_stored(bus: Bus, messages: list[Outgoing], within: float = 90.0) -> None:
    """As the outbox relay publishes: the same batch again while the bus is unavailable."""
    deadline = time.monotonic() + within
    while True:
        try:
            await bus.publish_many(messages, timeout=5.0)
            return
        except Exception as exc:
            assert is_unavailable(exc), f"a publish refused for good across a leader change: {exc!r}"
            assert time.monotonic() < deadline, f"still refused after {within}s: {exc!r}"
            await asyncio.sleep(0.5)


async def test_consumers_and_publishers_carry_on_when_the_stream_leader_is_lost(
        cluster: NatsCluster, namespace: str) -> None:
    bus = await Bus.connect(cluster.url, namespace, limits=BusLimits(stream_replicas=3))
    try:
        await bus.ensure_streams()
        subject = bus.names.events_subject("JobAdmitted")
        one: list[bytes] = []
        batched: list[bytes] = []

        async def handler(delivery: Delivery) -> None:
            one.append(delivery.data)

        async def batch_handler(deliveries: list[Delivery]) -> list[BaseException | None]:
            batched.extend(d.data for d in deliveries)
            return [None] * len(deliveries)

        consumers = [await bus.consume("one-by-one", [subject], handler, batch=16),
                     await bus.consume("batched", [subject], handler, batch=16, batch_handler=batch_handler)]

        def batch(first: int) -> list[Outgoing]:
            return [Outgoing(subject, str(i).encode(), f"m-{i}") for i in range(first, first + 20)]

        await publish_until_stored(bus, batch(0))
        info = await bus.js.stream_info(bus.names.stream(EVENTS))
        leader = info.cluster.leader if info.cluster else None
        assert leader in cluster.servers, info.cluster
        cluster.kill(leader)
        for first in range(20, 100, 20):
            await publish_until_stored(bus, batch(first))

        wanted = {str(i).encode() for i in range(100)}
        deadline = time.monotonic() + 90
        while not (wanted <= set(one) and wanted <= set(batched)):
            for consumer in consumers:
                assert not consumer.task.done(), f"consumer {consumer.durable} ended: {consumer.task}"
            assert time.monotonic() < deadline, (
                f"not delivered after the leader change: one by one {sorted(wanted - set(one))}, "
                f"batched {sorted(wanted - set(batched))}")
            await asyncio.sleep(0.2)
    finally:
        await bus.close()


async def test_a_client_without_a_replicas_setting_creates_three_replica_streams_in_a_cluster(
        cluster: NatsCluster, namespace: str) -> None:
    """A CLI run before the services creates the streams as the services declare them: with one
    replica they would be remapped to three later, and a server lost before the new replicas
    catch up can leave such a stream without a leader for minutes."""
    async with await Bus.connect(cluster.url, namespace) as bus:
        assert bus.limits.stream_replicas is None
        await bus.ensure_streams()
        for kind in ("events", "inbox", "dlq", "logs"):
            assert (await bus.js.stream_info(bus.names.stream(kind))).config.num_replicas == 3, kind
    one = cluster.url.split(",")[0]
    async with await Bus.connect(one, f"{namespace}-one") as bus:  # one server named: one replica
        await bus.ensure_streams()
        assert (await bus.js.stream_info(bus.names.stream("events"))).config.num_replicas == 1


def test_a_cluster_whose_port_is_taken_before_it_binds_starts_on_other_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ports are picked, then bound by the servers: on a busy machine another process may take one
    in between, which is no reason for a test to fail."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        picks = iter([int(held.getsockname()[1])])  # the first route port: taken
        real = helper.free_port
        monkeypatch.setattr(helper, "free_port", lambda host: next(picks, None) or real(host))
        password = secrets.token_urlsafe(16)
        nats = NatsCluster(nats_authorization([superuser("corral-test", password)]), "corral-test", password)
        try:
            nats.start()
            assert len(nats.servers) == 3
            assert all(s.proc is not None and s.proc.poll() is None for s in nats.servers.values())
        finally:
            nats.stop()
