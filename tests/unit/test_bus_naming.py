"""Pure pieces of the bus: names derived from the namespace, retry delays, dead-letter headers."""

from __future__ import annotations

import pytest

from corral.bus import Delivery, Namespace
from corral.bus.delivery import (
    DLQ_ERROR,
    DLQ_MSG_ID,
    DLQ_SUBJECT,
    dead_letter_headers,
    dead_letter_msg_id,
    retry_delay,
)


def test_the_namespace_prefixes_subjects_and_stream_names() -> None:
    ns = Namespace("corral")
    assert ns.events_subject("JobSubmitted") == "corral.events.JobSubmitted"
    assert ns.inbox_subject("placement.requests") == "corral.inbox.placement.requests"
    assert ns.dlq_subject("admission") == "corral.dlq.admission"
    streams = [ns.stream(kind) for kind in ("events", "inbox", "dlq")]
    assert streams == ["CORRAL_EVENTS", "CORRAL_INBOX", "CORRAL_DLQ"]
    assert ns.wildcard("events") == "corral.events.>"


def test_a_consumer_maps_to_the_one_stream_holding_its_subjects() -> None:
    ns = Namespace("corral")
    assert ns.stream_for(["corral.events.JobSubmitted", "corral.events.*"]) == "CORRAL_EVENTS"
    assert ns.stream_for(["corral.dlq.>"]) == "CORRAL_DLQ"
    with pytest.raises(ValueError, match="several streams"):
        ns.stream_for(["corral.events.A", "corral.inbox.b"])
    with pytest.raises(ValueError, match="not under namespace"):
        ns.stream_for(["other.events.A"])
    with pytest.raises(ValueError, match="not under namespace"):
        ns.stream_for(["corral.events."])


@pytest.mark.parametrize("bad", ["", "a.b", "a b", "*", ">"])
def test_names_that_would_break_subjects_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="namespace"):
        Namespace(bad)
    with pytest.raises(ValueError, match="event type"):
        Namespace("corral").events_subject(bad)


def test_retry_delay_walks_the_backoff_list_then_stays_on_its_last_entry() -> None:
    backoff = [0.5, 2.0, 10.0]
    assert [retry_delay(backoff, n) for n in range(1, 6)] == [0.5, 2.0, 10.0, 10.0, 10.0]
    assert retry_delay([], 3) == 0.0


def test_a_dead_letter_keeps_the_original_headers_and_says_what_failed() -> None:
    delivery = Delivery(subject="corral.events.JobSubmitted", data=b"{}",
                        headers={"Nats-Msg-Id": "evt-1", "X-Trace": "t"}, delivery_count=5,
                        stream="CORRAL_EVENTS", stream_sequence=42, consumer_sequence=7, timestamp=None)
    headers = dead_letter_headers(delivery, "admission", "boom\r\nTraceback:\n  line" + "x" * 5000)
    assert headers["X-Trace"] == "t"
    assert "Nats-Msg-Id" not in headers  # the dead letter gets its own id
    assert headers[DLQ_MSG_ID] == "evt-1"
    assert headers[DLQ_SUBJECT] == "corral.events.JobSubmitted"
    assert "\n" not in headers[DLQ_ERROR] and "\r" not in headers[DLQ_ERROR]
    assert len(headers[DLQ_ERROR]) <= 1024
    # one dead letter per original message, whichever consumer gives up on it
    assert dead_letter_msg_id(delivery, "admission") == dead_letter_msg_id(delivery, "quota") == "dlq:CORRAL_EVENTS:42"
    assert Namespace().dead_letter_subject("CORRAL_EVENTS", 42) == "corral.dlq.CORRAL_EVENTS.42"
