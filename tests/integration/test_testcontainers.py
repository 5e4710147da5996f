"""The testcontainers path: where a Docker engine answers, the event store runs on a containerised
Postgres and the bus on a containerised NATS; where none does (as on this project's CI machine),
the test is skipped with the reason, and the embedded servers cover the same ground."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.conftest import _docker_answers


@pytest.mark.docker
async def test_event_store_and_bus_work_on_servers_started_by_testcontainers() -> None:
    if not _docker_answers():
        pytest.skip("no Docker engine answers on this machine; testcontainers needs one")
    from testcontainers.core.container import DockerContainer
    from testcontainers.postgres import PostgresContainer

    from corral.bus import Bus
    from corral.eventstore import EventStore, NewEvent

    with PostgresContainer("postgres:16", driver=None) as pg, \
            DockerContainer("nats:2.11").with_command("-js").with_exposed_ports(4222) as nc:
        store = await EventStore.open(pg.get_connection_url())
        try:
            event = NewEvent(event_id="01J0000000000000000000000A", stream="job-x", type="T", schema_version=1,
                             data=b"{}", correlation_id=None, causation_id=None, occurred_at=datetime.now(UTC))
            assert await store.append("job-x", 0, [event]) == 1
        finally:
            await store.close()
        bus = await Bus.connect(f"nats://{nc.get_container_host_ip()}:{nc.get_exposed_port(4222)}", "tc")
        try:
            await bus.ensure_streams()
            published = await bus.publish("tc.events.T", b"{}", "m1")
            assert not published.duplicate
        finally:
            await bus.close()
