"""`CORRAL_NATS_SYNC`: how often the dev stack's nats-server fsyncs (`NatsServer.sync_interval`)."""

from __future__ import annotations

import pytest

from corral.stack.servers import nats_sync_interval


def test_the_default_is_one_second_and_always_or_an_interval_can_be_chosen() -> None:
    assert nats_sync_interval({}) == "1s"
    assert nats_sync_interval({"CORRAL_NATS_SYNC": "always"}) == "always"
    assert nats_sync_interval({"CORRAL_NATS_SYNC": " 200ms "}) == "200ms"


@pytest.mark.parametrize("value", ["fast", "0s", "1 s", "-1s", "1h"])
def test_another_value_is_refused_naming_the_variable_and_what_it_takes(value: str) -> None:
    with pytest.raises(ValueError, match=r"CORRAL_NATS_SYNC=.*give `always`.*200ms, 1s or 2m"):
        nats_sync_interval({"CORRAL_NATS_SYNC": value})
