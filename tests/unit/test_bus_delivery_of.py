"""`delivery_of` reads a JetStream reply subject as nats-py's `Msg.metadata` does."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.msg import Msg
from nats.errors import NotJSMessageError

from corral.bus.consumer import delivery_of

_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-_0123456789", min_size=1, max_size=12)
_counts = st.integers(min_value=0, max_value=2**63 - 1)


@given(stream=_names, consumer=_names, delivered=_counts, stream_seq=_counts, consumer_seq=_counts,
       ns=st.integers(min_value=0, max_value=4 * 10**18), pending=_counts, domain=st.none() | _names)
def test_the_reply_subject_reads_as_nats_py_reads_it(stream: str, consumer: str, delivered: int, stream_seq: int,
                                                     consumer_seq: int, ns: int, pending: int,
                                                     domain: str | None) -> None:
    fields = f"{stream}.{consumer}.{delivered}.{stream_seq}.{consumer_seq}.{ns}.{pending}"
    reply = f"$JS.ACK.{fields}" if domain is None else f"$JS.ACK.{domain}.hash.{fields}.token"
    msg = Msg(None, subject="ns.events.GangReserved", reply=reply, data=b"{}", headers={"Nats-Msg-Id": "x"})
    got, meta = delivery_of(msg), msg.metadata
    assert (got.delivery_count, got.stream, got.stream_sequence, got.consumer_sequence, got.timestamp) == (
        meta.num_delivered, meta.stream, meta.sequence.stream, meta.sequence.consumer, meta.timestamp)
    assert (got.subject, got.data, got.headers) == ("ns.events.GangReserved", b"{}", {"Nats-Msg-Id": "x"})


@pytest.mark.parametrize("reply", [None, "", "_INBOX.abc", "$JS.ACK.a.b.c"])
def test_a_message_that_is_not_jetstreams_is_refused_as_nats_py_refuses_it(reply: str | None) -> None:
    with pytest.raises(NotJSMessageError):
        delivery_of(Msg(None, subject="s", reply=reply, data=b"", headers=None))
