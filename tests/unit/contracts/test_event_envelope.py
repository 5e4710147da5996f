"""The envelope: sortable unique ids, causation and correlation filled for the producer."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.contracts import (
    ContractError,
    JobAdmitted,
    JobSubmitted,
    Reason,
    decode,
    encode,
    job_stream,
    new_event_id,
    node_stream,
    queue_stream,
    validate_job_spec,
)

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
SPEC = validate_job_spec({"name": "train", "queue": "research/nlp", "command": ["python", "t.py"]})


def test_event_ids_are_ulids_sorted_by_time() -> None:
    ids = [new_event_id(T0 + timedelta(milliseconds=ms)) for ms in (0, 1, 2, 1000, 86_400_000)]
    assert ids == sorted(ids)
    assert all(len(i) == 26 for i in ids)


def test_event_id_is_reproducible_with_given_randomness() -> None:
    assert new_event_id(T0, b"\x00" * 10) == new_event_id(T0.timestamp(), b"\x00" * 10)
    assert new_event_id(T0, b"\x00" * 10) != new_event_id(T0, b"\x00" * 9 + b"\x01")


@settings(max_examples=500)
@given(st.integers(0, (1 << 48) - 1), st.binary(min_size=10, max_size=10))
def test_an_event_id_is_the_crockford_base32_of_its_130_bits_digit_by_digit(millis: int, rand: bytes) -> None:
    at = millis / 1000
    value = (int(at * 1000) << 80) | int.from_bytes(rand, "big")  # the millisecond as it reads `at`
    digits = []
    for _ in range(26):
        digits.append("0123456789ABCDEFGHJKMNPQRSTVWXYZ"[value & 31])
        value >>= 5
    assert new_event_id(at, rand) == "".join(reversed(digits))


def test_event_ids_in_one_millisecond_differ() -> None:
    assert len({new_event_id(T0) for _ in range(1000)}) == 1000


def test_event_id_rejects_bad_randomness_length() -> None:
    with pytest.raises(ValueError, match="10 bytes"):
        new_event_id(T0, b"short")


def test_new_fills_the_envelope() -> None:
    event = JobSubmitted.new(stream=job_stream("j1"), actor="cli:alice", job_id="j1", spec=SPEC, now=T0)
    assert event.type == "JobSubmitted"
    assert event.schema_version == 2
    assert event.occurred_at == T0
    assert event.stream == "job-j1"
    assert event.correlation_id == event.event_id  # a root event correlates to itself
    assert event.causation_id is None
    assert event.actor == "cli:alice"


def test_caused_event_inherits_correlation_and_names_its_cause() -> None:
    submitted = JobSubmitted.new(stream="job-j1", actor="cli", job_id="j1", spec=SPEC,
                                 correlation_id="j1")
    admitted = JobAdmitted.new(stream="job-j1", actor="admission", causation=submitted, job_id="j1",
                               queue="research/nlp", priority=500, replicas=1, gpus_per_replica=1)
    assert admitted.causation_id == submitted.event_id
    assert admitted.correlation_id == "j1"


def test_new_rejects_an_invalid_payload_at_the_producer() -> None:
    with pytest.raises(ContractError) as info:
        JobAdmitted.new(stream="job-j1", actor="admission", job_id="j1", queue="research/nlp",
                        priority="high", replicas=0, gpus_per_replica=1)
    assert info.value.field in {"priority", "replicas"}


def test_naive_timestamps_are_refused_on_the_wire() -> None:
    event = JobSubmitted.new(stream="job-j1", actor="cli", job_id="j1", spec=SPEC, now=T0)
    data = encode(event).replace(b'"2026-12-02T12:00:00Z"', b'"2026-12-02T12:00:00"')
    with pytest.raises(ContractError) as info:
        decode(data)
    assert info.value.field == "occurred_at"


def test_schema_version_is_fixed_by_the_class() -> None:
    with pytest.raises(ValueError, match="schema_version 3"):
        JobSubmitted(event_id=new_event_id(T0), schema_version=3, occurred_at=T0, stream="job-j1",
                     correlation_id="j1", actor="cli", job_id="j1", spec=SPEC)


def test_stream_names() -> None:
    assert (job_stream("a"), node_stream("n"), queue_stream("research/nlp")) == (
        "job-a", "node-n", "queue-research/nlp")


def test_reason_codes_are_upper_snake() -> None:
    from corral.contracts import PlacementPending

    with pytest.raises(ContractError):
        PlacementPending.new(stream="job-j", actor="placement", job_id="j",
                             reason=Reason(code="gang does not fit", message="x"))
    ok = PlacementPending.new(stream="job-j", actor="placement", job_id="j",
                              reason=Reason(code="GANG_DOES_NOT_FIT", message="needs 32, best rack has 24",
                                            details={"needed": 32, "best": 24}))
    assert decode(encode(ok)) == ok


def test_the_time_in_an_event_id_is_the_millisecond_it_was_made() -> None:
    from datetime import UTC, datetime

    from corral.contracts.envelope import event_id_time, new_event_id

    made = datetime(2026, 12, 3, 19, 0, 0, 123000, tzinfo=UTC)
    assert event_id_time(new_event_id(made)) == made
