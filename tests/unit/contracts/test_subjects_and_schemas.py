"""Subjects live under a namespace prefix; exported schemas describe every contract."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.contracts import JobSubmitted, Subjects, encode, inbox_subject_for, subject_for, validate_job_spec
from corral.contracts.envelope import Event
from corral.contracts.events import ALL_EVENTS
from corral.contracts.schema import export_schemas
from corral.contracts.subjects import INBOX_JOB_CANCEL_REQUESTED, INBOX_JOB_SUBMITTED

from .strategies import struct_strategy

SPEC = validate_job_spec({"name": "train", "queue": "research/nlp", "command": ["python", "t.py"]})


def test_event_subjects_carry_the_type_under_the_prefix() -> None:
    event = JobSubmitted.new(stream="job-j", actor="cli", job_id="j", spec=SPEC)
    assert subject_for(event) == "corral.events.JobSubmitted"
    assert subject_for(event, prefix="t42") == "t42.events.JobSubmitted"
    assert inbox_subject_for(event) == INBOX_JOB_SUBMITTED == "corral.inbox.JobSubmitted"
    assert INBOX_JOB_CANCEL_REQUESTED == "corral.inbox.JobCancelRequested"


def test_only_inbox_types_have_an_inbox_subject() -> None:
    with pytest.raises(ValueError, match="not an inbox type"):
        Subjects().inbox("JobAdmitted")


def test_prefix_gives_isolated_wildcards_and_stream_names() -> None:
    subjects = Subjects("test-ab12")
    assert subjects.events_wildcard == "test-ab12.events.>"
    assert subjects.inbox_wildcard == "test-ab12.inbox.>"
    assert subjects.dead_letter("placement") == "test-ab12.dlq.placement"
    assert subjects.events_stream == "TEST-AB12_EVENTS"
    assert subjects.inbox_stream == "TEST-AB12_INBOX"
    assert Subjects().events_stream == "CORRAL_EVENTS"


@pytest.mark.parametrize("prefix", ["", "a b", "a.>", "*", "a..b"])
def test_bad_prefix_is_refused(prefix: str) -> None:
    with pytest.raises(ValueError):
        Subjects(prefix)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("schemas")
    export_schemas(out)
    return out


def test_export_writes_valid_json_for_every_event_and_spec(exported: Path) -> None:
    names = {p.name for p in exported.iterdir()}
    expected = {f"{c.type_name()}.v{c.version()}.schema.json" for c in ALL_EVENTS}
    expected |= {"JobSpec.schema.json", "ClusterSpec.schema.json", "QueuesFile.schema.json", "asyncapi.json",
                 "NodeAssignment.v1.schema.json"}
    assert names == expected
    for path in exported.iterdir():
        document = json.loads(path.read_text())
        assert isinstance(document, dict) and document


def test_event_schema_pins_type_and_version(exported: Path) -> None:
    schema = json.loads((exported / "JobSubmitted.v2.schema.json").read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["properties"]["type"] == {"enum": ["JobSubmitted"]}
    assert schema["properties"]["schema_version"]["const"] == 2
    assert {"type", "event_id", "occurred_at", "stream", "correlation_id", "actor", "job_id", "spec"} <= set(
        schema["required"])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.filter_too_much])
@given(st.sampled_from(ALL_EVENTS).flatmap(struct_strategy))
def test_encoded_events_use_exactly_the_schema_fields(event: Event) -> None:
    # A light structural check (no jsonschema dependency): keys present are declared, required ones present.
    schemas = _schemas()
    doc = msgspec.json.decode(encode(event))
    schema = schemas[doc["type"]]
    assert set(doc) <= set(schema["properties"])
    assert set(schema["required"]) <= set(doc)
    assert schema["additionalProperties"] is False


_CACHE: dict[str, dict[str, Any]] = {}


def _schemas() -> dict[str, dict[str, Any]]:
    if not _CACHE:
        from corral.contracts.schema import event_schema

        _CACHE.update({c.type_name(): event_schema(c) for c in ALL_EVENTS})
    return _CACHE


def test_asyncapi_document_lists_event_and_inbox_channels(exported: Path) -> None:
    document = json.loads((exported / "asyncapi.json").read_text())
    assert document["asyncapi"] == "3.0.0"
    channels = document["channels"]
    for cls in ALL_EVENTS:
        assert f"corral.events.{cls.type_name()}" in channels
    assert "corral.inbox.JobSubmitted" in channels
    assert document["operations"]["corral.inbox.JobSubmitted"]["action"] == "receive"
    payload = document["components"]["schemas"]["corral.inbox.JobSubmitted:Message:Payload"]
    assert payload["properties"]["spec"]["properties"]["gpus_per_replica"]["type"] == "integer"


def test_committed_schemas_match_the_contracts() -> None:
    # contracts/schemas/ is what other-language pipelines read; refresh it after a contract change with
    # `python -m corral.contracts.schema contracts/schemas`.
    from corral.contracts.schema import json_schema_documents, render

    committed = Path(__file__).resolve().parents[3] / "contracts" / "schemas"
    documents = json_schema_documents()
    assert {p.name for p in committed.glob("*.schema.json")} == set(documents)
    for name, document in documents.items():
        assert (committed / name).read_text() == render(document), (
            f"{name} is stale: run python -m corral.contracts.schema contracts/schemas")
