"""Log chunks on the bus (`corral.contracts.logs`): subjects, and a reader that trusts no chunk."""

from __future__ import annotations

import pytest

from corral.contracts.logs import (
    LogChunk,
    LogChunkRefused,
    chunk_msg_id,
    covered,
    decode_chunk,
    encode_chunk,
    log_filter,
    log_subject,
    parse_log_subject,
)


def _chunk(**kw: object) -> LogChunk:
    fields: dict[str, object] = {"job_id": "j.1", "attempt": 2, "node": "gpu.7", "rank": 3, "offset": 10,
                                 "end": 20, "lines": ["hello"]}
    return LogChunk(**{**fields, **kw})


def test_a_subject_names_job_attempt_node_and_rank_as_single_tokens() -> None:
    subject = log_subject("corral", "j.1", 2, "gpu.7", 3)
    assert subject == "corral.logs.j~1.2.gpu~7.3"
    where = parse_log_subject("corral", subject)
    assert (where.job_id, where.attempt, where.node, where.rank) == ("j.1", 2, "gpu.7", 3)
    assert log_filter("corral", "j.1") == "corral.logs.j~1.*.*.*"
    assert log_filter("corral", "j.1", attempt=0, rank=5) == "corral.logs.j~1.0.*.5"
    with pytest.raises(ValueError, match="job id"):
        log_subject("corral", "../etc", 0, "n", 0)
    with pytest.raises(ValueError, match="node"):
        log_subject("corral", "j", 0, "a b", 0)


def test_a_chunk_round_trips_and_its_message_id_is_its_place_in_the_file() -> None:
    chunk = _chunk()
    subject = log_subject("corral", "j.1", 2, "gpu.7", 3)
    assert decode_chunk("corral", subject, encode_chunk(chunk)) == chunk
    assert chunk_msg_id(chunk) == chunk_msg_id(_chunk(lines=["other"])) != chunk_msg_id(_chunk(offset=15))


@pytest.mark.parametrize(("subject", "data", "says"), [
    ("corral.logs.j~1.2.gpu~7.3", b"\xff not json", "not JSON"),
    ("corral.logs.j~1.2.gpu~7.3", b'{"job_id": "j.1"}', "missing required field"),
    ("corral.logs.j~1.2.gpu~7.3", encode_chunk(_chunk(rank=4)), "not what its subject says"),
    ("corral.logs.j~1.2.node-0.3", encode_chunk(_chunk()), "not what its subject says"),
    ("corral.logs.j~1.2.gpu~7.3", encode_chunk(_chunk(v=9)), "version 9"),
    ("corral.logs.j~1.2.gpu~7.3", encode_chunk(_chunk(end=1)), "end 1 < offset 10"),
    ("corral.logs.j~1.x.gpu~7.3", encode_chunk(_chunk()), "is not corral.logs."),
    ("corral.logs.j~1.2.gpu~7.3", b'{"job_id":"j.1","attempt":2,"node":"gpu.7","rank":3,"offset":-1,'
                                  b'"end":2,"lines":[]}', "offset"),
])
def test_a_bad_chunk_is_refused_naming_what_is_wrong(subject: str, data: bytes, says: str) -> None:
    with pytest.raises(LogChunkRefused, match=says):
        decode_chunk("corral", subject, data)


def test_a_chunk_seen_already_is_covered_and_a_longer_one_from_the_same_offset_is_not() -> None:
    assert covered(_chunk(offset=10, end=20), 20) and covered(_chunk(offset=10, end=15), 20)
    assert not covered(_chunk(offset=10, end=30), 20) and not covered(_chunk(), None)
    assert chunk_msg_id(_chunk(end=20)) != chunk_msg_id(_chunk(end=30))


@pytest.mark.parametrize("subject", ["corral.logs.j1.².node-1.0", "corral.logs.j1.0.node-1.٣",
                                     "corral.logs.j1.0.node-1.99999999999999999999", "corral.logs.j1.-1.node-1.0"])
def test_a_subject_with_a_number_int_refuses_is_refused_not_a_traceback(subject: str) -> None:
    """The review: '²'.isdigit() is True and int('²') raises ValueError, which `corral logs` did not
    catch: one forged subject ended every later `corral logs JOB` in a traceback."""
    with pytest.raises(LogChunkRefused):
        parse_log_subject("corral", subject)


def test_a_log_subject_names_the_jobs_owner_and_the_version_1_one_none() -> None:
    from corral.contracts.logs import log_filter, log_subject, owner_filter, parse_log_subject

    owned = log_subject("corral", "j.1", 2, "gpu.0", 3, owner="alice")
    assert owned == "corral.logs.user.alice.j~1.2.gpu~0.3"
    parsed = parse_log_subject("corral", owned)
    assert (parsed.job_id, parsed.attempt, parsed.node, parsed.rank, parsed.owner) == ("j.1", 2, "gpu.0", 3, "alice")
    assert parse_log_subject("corral", "corral.logs.j1.0.node-0.0").owner is None
    assert parse_log_subject("corral", "corral.logs.user.0.node-0.0").job_id == "user"  # a job named `user`
    assert log_filter("corral", "j1", owner="alice") == "corral.logs.user.alice.j1.*.*.*"
    assert log_filter("corral", "j1", 0, 1, any_owner=True) == "corral.logs.user.*.j1.0.*.1"
    assert log_filter("corral", "j1") == "corral.logs.j1.*.*.*"
    assert owner_filter("corral", "bob") == "corral.logs.user.bob.>"
    with pytest.raises(ValueError):
        log_subject("corral", "j1", 0, "node-0", 0, owner="a b")
