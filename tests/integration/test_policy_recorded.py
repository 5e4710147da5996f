"""Quota records the scheduling policy it decides by (PolicyInForce) when the log names another,
so that readers rerun decisions under the cluster's policy; a restart under the same policy
records nothing."""

from __future__ import annotations

from corral.bus import Bus
from corral.contracts.envelope import POLICY_STREAM
from corral.contracts.registry import decode
from corral.eventstore import EventStore
from corral.services.quota.service import Quota
from corral.services.settings import Settings


async def recorded_policies(store: EventStore) -> list[str]:
    return [decode(s.data).policy for s in await store.read_stream(POLICY_STREAM)]


async def start_quota(store: EventStore, bus: Bus, settings: Settings) -> Quota:
    quota = Quota(store, bus, settings=settings)
    await quota.rebuild()
    await quota.started()
    return quota


async def test_quota_records_a_policy_when_it_changes_and_only_then(
        nats_url: str, postgres_dsn: str, namespace: str, bus: Bus) -> None:
    store = await EventStore.open(postgres_dsn, pool_size=2)
    try:
        def under(policy: str) -> Settings:
            return Settings(nats_url=nats_url, postgres_dsn=postgres_dsn, namespace=namespace, policy=policy)

        await start_quota(store, bus, under("corral"))  # the default is what an empty log means
        assert await recorded_policies(store) == []
        quota = await start_quota(store, bus, under("fair-las"))
        assert await recorded_policies(store) == ["fair-las"]
        assert quota.view.policy == "fair-las"
        await start_quota(store, bus, under("fair-las"))  # a restart: nothing new
        assert await recorded_policies(store) == ["fair-las"]
        back = await start_quota(store, bus, under("corral"))
        assert await recorded_policies(store) == ["fair-las", "corral"]
        assert back.view.policy == "corral"
    finally:
        await store.close()
