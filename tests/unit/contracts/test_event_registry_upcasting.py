"""Old versions stay readable: an upcaster lifts a v0 JobSubmitted to v1 on decode (and the
registered v1 -> v2 upcaster on to the current version)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from corral.contracts import ContractError, EventRegistry, JobSubmitted, new_event_id
from corral.contracts.events import ALL_EVENTS, UPCASTERS

V0_JOB_SUBMITTED = {
    # v0 (hypothetical, for the test): the spec was flat, `gpus` was the total, no replicas.
    "type": "JobSubmitted",
    "schema_version": 0,
    "event_id": new_event_id(1_700_000_000.0, b"\x01" * 10),
    "occurred_at": "2023-11-14T22:13:20Z",
    "stream": "job-old1",
    "correlation_id": "old1",
    "actor": "cli",
    "job_id": "old1",
    "name": "legacy",
    "queue": "research",
    "gpus": 8,
    "cmd": "python train.py",
}


def job_submitted_v0_to_v1(doc: dict[str, Any]) -> dict[str, Any]:
    spec = {"name": doc.pop("name"), "queue": doc.pop("queue"), "gpus_per_replica": doc.pop("gpus"),
            "command": doc.pop("cmd").split()}
    return {**doc, "schema_version": 1, "spec": spec}


def registry_with_upcaster() -> EventRegistry:
    registry = EventRegistry(ALL_EVENTS)
    registry.register_upcaster("JobSubmitted", 0, job_submitted_v0_to_v1)
    for type_name, version, upcaster in UPCASTERS:
        registry.register_upcaster(type_name, version, upcaster)
    return registry


def test_v0_job_submitted_decodes_as_current_version() -> None:
    event = registry_with_upcaster().decode(msgspec.json.encode(V0_JOB_SUBMITTED))
    assert isinstance(event, JobSubmitted)
    assert event.schema_version == 2
    assert event.spec.gpus_per_replica == 8
    assert event.spec.command == ["python", "train.py"]
    assert event.event_id == V0_JOB_SUBMITTED["event_id"]


def test_without_the_upcaster_v0_is_an_unknown_version() -> None:
    with pytest.raises(ContractError, match="schema_version 0"):
        EventRegistry(ALL_EVENTS).decode(msgspec.json.encode(V0_JOB_SUBMITTED))


def test_upcast_result_is_validated_like_any_payload() -> None:
    bad = {**V0_JOB_SUBMITTED, "gpus": 0}
    with pytest.raises(ContractError) as info:
        registry_with_upcaster().decode(msgspec.json.encode(bad))
    assert info.value.field == "spec.gpus_per_replica"


def test_a_failing_upcaster_is_a_contract_error() -> None:
    broken = {k: v for k, v in V0_JOB_SUBMITTED.items() if k != "cmd"}
    with pytest.raises(ContractError, match="cannot upcast JobSubmitted v0"):
        registry_with_upcaster().decode(msgspec.json.encode(broken))


def test_upcaster_must_advance_the_version() -> None:
    registry = EventRegistry(ALL_EVENTS)
    registry.register_upcaster("JobSubmitted", 0, lambda doc: doc)
    with pytest.raises(ContractError, match="schema_version 1"):
        registry.decode(msgspec.json.encode(V0_JOB_SUBMITTED))


def test_registering_a_second_class_for_one_type_and_version_is_refused() -> None:
    class JobSubmittedClash(JobSubmitted, frozen=True, kw_only=True, tag="JobSubmitted"):
        pass

    with pytest.raises(ValueError, match="already registered"):
        EventRegistry(ALL_EVENTS).register(JobSubmittedClash)
