"""Publish acknowledgements read by `corral.bus.bus.pub_ack` as nats-py reads them (msgspec instead of
`json.loads` + `PubAck.from_response`): the same stream, sequence and duplicate flag, the same
JetStream error, a clear error for anything else."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.js.api import PubAck
from nats.js.errors import APIError

from corral.bus.bus import pub_ack


@given(st.text(min_size=1, max_size=20), st.integers(0, 2**63 - 1), st.one_of(st.none(), st.booleans()),
       st.one_of(st.none(), st.text(max_size=5)))
def test_an_acknowledgement_reads_as_nats_py_reads_it(stream: str, seq: int, duplicate: bool | None,
                                                      domain: str | None) -> None:
    reply = {"stream": stream, "seq": seq, **({"duplicate": duplicate} if duplicate is not None else {}),
             **({"domain": domain} if domain is not None else {}), "unknown_field": [1, 2]}
    data = json.dumps(reply).encode()
    ours, theirs = pub_ack(data), PubAck.from_response(json.loads(data))
    assert not isinstance(ours, APIError)
    assert (ours.stream, ours.seq, ours.duplicate) == (theirs.stream, theirs.seq, theirs.duplicate)


def test_an_error_reply_is_the_jetstream_error() -> None:
    data = b'{"error": {"code": 400, "err_code": 10054, "description": "message size exceeds maximum allowed"}}'
    error = pub_ack(data)
    assert isinstance(error, APIError) and error.err_code == 10054 and "maximum" in str(error.description)


@pytest.mark.parametrize("data", [b"", b"{", b"[]", b'{"stream": "S"}', b'{"seq": 3}', b'{"stream": 3, "seq": 1}'])
def test_anything_else_is_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        pub_ack(data)
