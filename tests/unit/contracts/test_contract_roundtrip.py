"""Every contract survives encode -> decode unchanged (envelope, payload and nested specs)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.contracts import ClusterSpec, JobSpec, QueueSpec, decode, encode
from corral.contracts.envelope import Event
from corral.contracts.events import ALL_EVENTS
from corral.contracts.registry import REGISTRY

from .strategies import struct_strategy

#: Per class: every class is drawn on its own (the cost is drawing its nested specs, not the check).
ROUND_TRIP = settings(max_examples=20, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def test_every_registered_event_class_is_in_all_events() -> None:
    assert set(REGISTRY.classes()) == set(ALL_EVENTS)
    assert len({c.type_name() for c in ALL_EVENTS}) == len(ALL_EVENTS)


@pytest.mark.parametrize("cls", ALL_EVENTS, ids=lambda c: c.type_name())
def test_event_round_trips_through_json(cls: type[Event]) -> None:
    @ROUND_TRIP
    @given(struct_strategy(cls))
    def check(event: Event) -> None:
        data = encode(event)
        decoded = decode(data)
        assert type(decoded) is cls
        assert decoded == event
        assert encode(decoded) == data  # byte-stable, so the log and the bus agree

    check()


@pytest.mark.parametrize("spec_cls", [JobSpec, ClusterSpec, QueueSpec], ids=lambda c: c.__name__)
def test_spec_round_trips_through_json(spec_cls: type[msgspec.Struct]) -> None:
    @ROUND_TRIP
    @given(struct_strategy(spec_cls))
    def check(spec: msgspec.Struct) -> None:
        assert msgspec.json.decode(msgspec.json.encode(spec), type=spec_cls) == spec

    check()


@ROUND_TRIP
@given(st.sampled_from(ALL_EVENTS).flatmap(struct_strategy))
def test_decoded_event_type_and_version_match_the_wire(event: Event) -> None:
    doc = msgspec.json.decode(encode(event))
    assert doc["type"] == event.type == type(event).type_name()
    assert doc["schema_version"] == event.schema_version == type(event).version()
