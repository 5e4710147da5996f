"""The decoder turns every malformed payload into ContractError, and nothing else.

Consumers dead-letter on ContractError; any other exception from `decode` would crash a
service on one bad message from a foreign pipeline, so this is fuzzed broadly.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.contracts import ContractError, decode, encode
from corral.contracts.envelope import Event
from corral.contracts.events import ALL_EVENTS

from .strategies import json_values, struct_strategy

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
#: The fuzz built on drawn events: drawing an event (its nested specs) is most of the cost.
EVENT_FUZZ = settings(FUZZ, max_examples=75)

events = st.sampled_from(ALL_EVENTS).flatmap(struct_strategy)


def _decode_only_raises_contract_error(data: Any) -> None:
    try:
        decode(data)
    except ContractError as e:
        assert str(e)
    # any other exception propagates and fails the test


@FUZZ
@given(st.binary(max_size=200))
def test_random_bytes_raise_contract_error_only(data: bytes) -> None:
    _decode_only_raises_contract_error(data)


@FUZZ
@given(st.text(max_size=100))
def test_random_text_raises_contract_error_only(text: str) -> None:
    _decode_only_raises_contract_error(text)


@FUZZ
@given(json_values)
def test_random_json_raises_contract_error(doc: Any) -> None:
    with pytest.raises(ContractError):
        decode(msgspec.json.encode(doc))


@FUZZ
@given(st.dictionaries(st.sampled_from(["type", "schema_version", "event_id", "job_id", "spec"]),
                       json_values, max_size=5)
       .map(lambda d: {**d, "type": d.get("type", "JobSubmitted")}))
def test_json_objects_shaped_like_events_raise_contract_error(doc: dict[str, Any]) -> None:
    with pytest.raises(ContractError):
        decode(msgspec.json.encode(doc))


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            found.extend(_paths(v, (*prefix, k)))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            found.extend(_paths(v, (*prefix, i)))
    return found


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for step in path[:-1]:
        doc = doc[step]
    doc[path[-1]] = value


def _delete(doc: Any, path: tuple[Any, ...]) -> None:
    for step in path[:-1]:
        doc = doc[step]
    del doc[path[-1]]


@EVENT_FUZZ
@given(events, st.data())
def test_mutated_valid_events_never_raise_another_exception(event: Event, data: st.DataObject) -> None:
    doc = msgspec.json.decode(encode(event))
    path = data.draw(st.sampled_from(_paths(doc)))
    action = data.draw(st.sampled_from(["replace", "delete", "unknown_key"]))
    if action == "replace":
        _set(doc, path, data.draw(json_values))
    elif action == "delete":
        _delete(doc, path)
    else:
        doc["unexpected_field"] = data.draw(json_values)
    _decode_only_raises_contract_error(msgspec.json.encode(doc))


@EVENT_FUZZ
@given(events, st.text(max_size=20), st.integers(-(2**70), 2**70))
def test_unknown_type_or_version_raises_contract_error(event: Event, type_name: str, version: int) -> None:
    doc = msgspec.json.decode(encode(event))
    known = {(c.type_name(), c.version()) for c in ALL_EVENTS}
    doc["type"], doc["schema_version"] = type_name, version
    if (type_name, version) in known:
        return
    with pytest.raises(ContractError):
        decode(msgspec.json.encode(doc))


@EVENT_FUZZ
@given(events, st.integers(1, 40))
def test_truncated_events_raise_contract_error(event: Event, cut: int) -> None:
    data = encode(event)
    with pytest.raises(ContractError):
        decode(data[: max(0, len(data) - cut)])


def test_wrong_field_type_names_the_field() -> None:
    doc = _valid_job_submitted()
    doc["spec"]["topology"]["gang"] = "galaxy"
    with pytest.raises(ContractError) as info:
        decode(msgspec.json.encode(doc))
    assert info.value.field == "spec.topology.gang"
    assert "spec.topology.gang" in str(info.value)


def test_missing_field_names_the_field() -> None:
    doc = _valid_job_submitted()
    del doc["actor"]
    with pytest.raises(ContractError) as info:
        decode(msgspec.json.encode(doc))
    assert info.value.field == "actor"


def test_unknown_type_names_the_type() -> None:
    doc = _valid_job_submitted()
    doc["type"] = "JobTeleported"
    with pytest.raises(ContractError, match="JobTeleported") as info:
        decode(msgspec.json.encode(doc))
    assert info.value.field == "type"


def test_unknown_version_says_which_version_is_current() -> None:
    doc = _valid_job_submitted()
    doc["schema_version"] = 7
    with pytest.raises(ContractError, match="current is 2") as info:
        decode(msgspec.json.encode(doc))
    assert info.value.field == "schema_version"


def test_cross_field_rule_of_nested_spec_names_the_field() -> None:
    doc = _valid_job_submitted()
    doc["spec"]["command"] = None
    with pytest.raises(ContractError) as info:
        decode(msgspec.json.encode(doc))
    assert info.value.field == "spec.command"


def _valid_job_submitted() -> dict[str, Any]:
    from corral.contracts import JobSubmitted, validate_job_spec

    spec = validate_job_spec({"name": "train", "queue": "research/nlp", "command": ["python", "t.py"]})
    event = JobSubmitted.new(stream="job-j1", actor="cli", job_id="j1", spec=spec)
    doc: dict[str, Any] = msgspec.json.decode(encode(event))
    return doc
