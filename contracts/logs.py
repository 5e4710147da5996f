"""Log chunks: a rank's output as node agents publish it to the bus, and how a reader checks it.

Why: `corral logs JOB` must work from any host, each attempt apart. Each node agent publishes
its ranks' output, in bounded chunks, to the JetStream stream `<NS>_LOGS` on the subject
`<ns>.logs.user.<owner>.<job>.<attempt>.<node>.<rank>` (`log_subject`): the job's owner (the user
its JobSubmitted records) is a token of the subject, so NATS permissions let a person read exactly
their own jobs' output (`corral.bus.auth`). Subject version 1, `<ns>.logs.<job>.<attempt>.<node>.<rank>`
(no owner; what older agents publish, and an agent that does not know a job's owner), is still
read, by admins only.
Log lines are user data, not events: they are not in the event log (Postgres), the stream keeps
them for a bounded time and size, and the full file stays on the node.

Every chunk is hostile to its reader: bus permissions let an agent publish only its own nodes'
subjects (`corral.bus.auth.agent`), and `decode_chunk` refuses a chunk whose body does not agree
with its subject or that is not a chunk at all, with a message naming the field.

Version 1 (`v`): a reader refuses versions it does not know, naming the one it read.
"""

from __future__ import annotations

import re
from typing import Annotated

import msgspec

__all__ = [
    "LOG_CHUNK_VERSION",
    "OWNED",
    "TRUNCATED_MARK",
    "LogChunk",
    "LogChunkRefused",
    "LogSubject",
    "chunk_msg_id",
    "covered",
    "decode_chunk",
    "encode_chunk",
    "log_filter",
    "log_subject",
    "owner_filter",
    "parse_log_subject",
]

LOG_CHUNK_VERSION = 1
_JOB = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # contracts.events.JobId
_NODE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$")  # a node name as contracts.subjects takes it
#: An attempt or rank token: ASCII digits only (`str.isdigit` also takes '²', which `int` refuses).
_NUMBER = re.compile(r"^[0-9]{1,9}$")
_PREFIX = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")

Count = Annotated[int, msgspec.Meta(ge=0)]


class LogChunk(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Consecutive lines of one rank's output in one attempt, as read from its log file.

    `offset` is where the first line (or the first dropped one) starts in the node's file and
    `end` where the last one read ends: the next chunk starts at `end`, and a chunk published twice
    has the same message id (`chunk_msg_id`), so the stream keeps one. `truncated`: how many of
    `lines` were cut at the agent's line limit (each ends with `TRUNCATED_MARK`). `dropped`:
    lines the rate limit dropped since the previous chunk; `skipped_bytes`: output skipped unread
    when the rank wrote faster than the agent could ship. `final`: the rank's last chunk of
    this attempt (it exited)."""

    v: int = LOG_CHUNK_VERSION
    job_id: str
    attempt: Count
    node: str
    rank: Count
    offset: Count
    end: Count
    lines: list[str]
    truncated: Count = 0
    dropped: Count = 0
    skipped_bytes: Count = 0
    final: bool = False
    at: float = 0.0


#: Appended to a line the agent cut at its line limit.
TRUNCATED_MARK = " [... line truncated by corral]"


class LogSubject(msgspec.Struct, frozen=True):
    """What a log subject names: job, attempt, node and rank, and the job's owner (None on a
    version-1 subject)."""

    job_id: str
    attempt: int
    node: str
    rank: int
    owner: str | None = None


class LogChunkRefused(ValueError):
    """A message on the log stream that is not a valid chunk: the message says which field and why."""


def _token(kind: str, name: str, pattern: re.Pattern[str]) -> str:
    if not pattern.match(name):
        raise ValueError(f"{kind} {name!r} cannot be a log subject token: use letters, digits, '.', '_' or '-'")
    return name.replace(".", "~")  # one subject token (as contracts.subjects does for node names)


def _check_prefix(prefix: str) -> None:
    if not _PREFIX.match(prefix):
        raise ValueError(f"subject prefix {prefix!r}: use letters, digits, '_', '-' and dots")


#: The token after `<prefix>.logs.` of a subject naming the job's owner (subject version 2).
OWNED = "user"


def _owner_tokens(owner: str | None) -> str:
    return "" if owner is None else f"{OWNED}.{_token('owner', owner, _NODE)}."


def log_subject(prefix: str, job_id: str, attempt: int, node: str, rank: int, *, owner: str | None = None) -> str:
    """`<prefix>.logs.user.<owner>.<job>.<attempt>.<node>.<rank>`, or without `owner` the version-1
    `<prefix>.logs.<job>.<attempt>.<node>.<rank>` ('.' in a name becomes '~')."""
    _check_prefix(prefix)
    if attempt < 0 or rank < 0:
        raise ValueError(f"attempt and rank must be >= 0, got attempt {attempt}, rank {rank}")
    return (f"{prefix}.logs.{_owner_tokens(owner)}{_token('job id', job_id, _JOB)}.{attempt}."
            f"{_token('node', node, _NODE)}.{rank}")


def log_filter(prefix: str, job_id: str, attempt: int | None = None, rank: int | None = None, *,
               owner: str | None = None, any_owner: bool = False) -> str:
    """The subjects of one job's chunks, optionally of one attempt and/or one rank (any node): those
    naming `owner`, those naming any owner (`any_owner`, an admin's), or else the version-1 ones."""
    _check_prefix(prefix)
    a = "*" if attempt is None else str(attempt)
    r = "*" if rank is None else str(rank)
    owned = f"{OWNED}.*." if any_owner else _owner_tokens(owner)
    return f"{prefix}.logs.{owned}{_token('job id', job_id, _JOB)}.{a}.*.{r}"


def owner_filter(prefix: str, owner: str) -> str:
    """Every log subject naming `owner`: what that person may read (`corral.bus.auth`)."""
    _check_prefix(prefix)
    return f"{prefix}.logs.{_owner_tokens(owner)}>"


def parse_log_subject(prefix: str, subject: str) -> LogSubject:
    """The job, attempt, node, rank (and owner) a log subject names; LogChunkRefused if it is not one."""
    head = f"{prefix}.logs."
    tokens = subject[len(head):].split(".") if subject.startswith(head) else []
    owner = None
    if len(tokens) == 6 and tokens[0] == OWNED:
        owner = tokens[1].replace("~", ".")
        tokens = tokens[2:]
    if len(tokens) != 4 or not _NUMBER.match(tokens[1]) or not _NUMBER.match(tokens[3]):
        raise LogChunkRefused(f"subject {subject!r} is not {head}[{OWNED}.<owner>.]<job>.<attempt>.<node>.<rank>")
    return LogSubject(tokens[0].replace("~", "."), int(tokens[1]), tokens[2].replace("~", "."), int(tokens[3]),
                      owner)


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(LogChunk)


def encode_chunk(chunk: LogChunk) -> bytes:
    return _ENCODER.encode(chunk)


def chunk_msg_id(chunk: LogChunk) -> str:
    """The JetStream message id of a chunk: the same chunk published again is stored once. The end
    is part of it: a restarted agent may cut a longer chunk from the same offset, which must not be
    dropped as a duplicate of the shorter one (a reader skips what it has seen: `covered`)."""
    return f"log-{chunk.job_id}-{chunk.attempt}-{chunk.node}-{chunk.rank}-{chunk.offset}-{chunk.end}"


def covered(chunk: LogChunk, seen_end: int | None) -> bool:
    """Whether a reader that has seen its rank's file up to `seen_end` has seen all of `chunk`
    already (a chunk published again after the stream's duplicate window)."""
    return seen_end is not None and chunk.offset < chunk.end <= seen_end


def decode_chunk(prefix: str, subject: str, data: bytes) -> LogChunk:
    """A chunk read from `subject`, checked: valid JSON of this version, and naming the same job,
    attempt, node and rank as its subject (which bus permissions tie to the publishing node).
    Raises LogChunkRefused naming what is wrong."""
    where = parse_log_subject(prefix, subject)
    try:
        chunk = _DECODER.decode(data)
    except msgspec.ValidationError as exc:
        raise LogChunkRefused(f"log chunk on {subject}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise LogChunkRefused(f"log chunk on {subject} is not JSON: {exc}") from None
    if chunk.v != LOG_CHUNK_VERSION:
        raise LogChunkRefused(f"log chunk on {subject}: version {chunk.v}, this reader knows "
                              f"{LOG_CHUNK_VERSION}; upgrade corral to read it")
    said = LogSubject(chunk.job_id, chunk.attempt, chunk.node, chunk.rank, where.owner)
    if said != where:
        raise LogChunkRefused(f"log chunk on {subject} names job {chunk.job_id} attempt {chunk.attempt} "
                              f"node {chunk.node} rank {chunk.rank}: not what its subject says")
    if chunk.end < chunk.offset:
        raise LogChunkRefused(f"log chunk on {subject}: end {chunk.end} < offset {chunk.offset}")
    return chunk
