"""Limits of the bus and of a submission (their pure parts)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.bus import Outgoing
from corral.bus.limits import BusLimits
from corral.bus.relay import message_size, not_relayed_alert
from corral.contracts import events as ev
from corral.contracts.envelope import job_stream
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.sizes import SPEC_TOO_LARGE, recorded_size, size_problem
from corral.eventstore import StoredEvent


def test_limits_have_sane_defaults_and_come_from_the_environment() -> None:
    limits = BusLimits()
    assert limits.max_spec_bytes < limits.max_event_bytes < limits.dlq_max_msg_bytes
    custom = BusLimits.from_env({"CORRAL_MAX_EVENT_BYTES": "2000", "CORRAL_MAX_SPEC_BYTES": "1000",
                                 "CORRAL_EVENTS_MAX_AGE": "60.5", "CORRAL_DLQ_MAX_MSGS": "7"})
    assert (custom.max_event_bytes, custom.max_spec_bytes, custom.events_max_age, custom.dlq_max_msgs) == (
        2000, 1000, 60.5, 7)


@pytest.mark.parametrize(("env", "match"), [
    ({"CORRAL_DLQ_MAX_MSGS": "lots"}, "CORRAL_DLQ_MAX_MSGS"),
    ({"CORRAL_INBOX_MAX_BYTES": "0"}, "inbox_max_bytes"),
    ({"CORRAL_MAX_SPEC_BYTES": str(2 * 1024 * 1024)}, "must be below max_event_bytes"),
])
def test_bad_limits_say_which_and_why(env: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BusLimits.from_env(env)


def test_a_submission_over_the_limit_is_a_problem_naming_size_limit_and_fix() -> None:
    spec = validate_job_spec({"name": "big", "queue": "q", "runtime": "sim", "duration_seconds": 1,
                              "env": {"BLOB": "x" * 5000}})
    submitted = ev.JobSubmitted.new(stream=job_stream("j1"), actor="user/a", job_id="j1", spec=spec)
    size = recorded_size(submitted)
    assert size > 5000
    assert size_problem(size, size) is None
    problem = size_problem(size, 4096)
    assert problem is not None and problem.path == "spec"
    assert f"{size:,}" in problem.message and "4,096" in problem.message and "CORRAL_MAX_SPEC_BYTES" in problem.message
    assert problem.hint and SPEC_TOO_LARGE == "SPEC_TOO_LARGE"


def test_message_size_counts_payload_and_headers() -> None:
    bare = message_size(Outgoing("s", b"x" * 100, "id"))
    assert bare > 100
    assert message_size(Outgoing("s", b"x" * 100, "id", {"K": "v" * 50})) == bare + len("K") + 50 + 4


@given(headers=st.dictionaries(st.text(min_size=1, max_size=20), st.text(max_size=40), max_size=8),
       msg_id=st.text(min_size=1, max_size=30))
def test_message_size_is_the_utf8_bytes_of_every_header_line(headers: dict[str, str], msg_id: str) -> None:
    """ASCII headers are counted in characters, others in bytes: the same sum either way."""
    every = {**headers, "Nats-Msg-Id": msg_id}
    expected = 100 + len("NATS/1.0\r\n\r\n") + sum(len(k.encode()) + len(v.encode()) + 4 for k, v in every.items())
    assert message_size(Outgoing("s", b"x" * 100, msg_id, headers)) == expected


def test_the_not_relayed_alert_is_the_same_event_for_the_same_skipped_event() -> None:
    at = datetime(2026, 12, 3, tzinfo=UTC)
    stored = StoredEvent(position=42, stream="job-j", version=1, event_id="01JF0000000000000000000000",
                         type="JobSubmitted", schema_version=1, data=b"{}", correlation_id="j", causation_id=None,
                         occurred_at=at, recorded_at=at)
    first = not_relayed_alert(stored, 9_000_000, 1_048_576, "too large")
    again = not_relayed_alert(stored, 9_000_000, 1_048_576, "too large")
    assert first.event_id == again.event_id and first.stream == "cluster"
    assert first.reason.code == "EVENT_TOO_LARGE" and first.position == 42 and first.size == 9_000_000
