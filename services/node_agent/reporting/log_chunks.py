"""A rank's log file as bounded, rate-limited chunks for the bus: the pure part of log shipping.

Why: a rank may write gigabytes, lines without end, or binary noise, and the bus is shared
by every node's control traffic. Published as it comes, one chatty job would fill the log stream
(pushing every other job's lines out) and slow the reports that placement waits for. So each rank's
output is shipped within limits (`ShipLimits`), and nothing is silently lost from view:

- a line longer than `max_line_bytes` is cut and marked (`TRUNCATED_MARK`, counted in `truncated`);
- a token bucket per rank (`rate_bytes` per second, up to `burst_bytes` at once) decides which
  lines go; the others are dropped and counted (`dropped`), and a chunk says how many before it;
- a rank that writes faster than the agent reads (a backlog over `max_backlog_bytes`) has the
  backlog skipped unread (`skipped_bytes`), so the shipper never falls behind for good;
- one chunk carries at most `max_chunk_bytes` of lines.

The full file stays on the node. The rank's file holds every attempt of the job that ran there
(the stepd writes a header line per attempt, `attempt_header`); a cursor ships one attempt: from
its header to the next attempt's header or the rank's exit.

Pure and deterministic: the caller reads the file and passes the bytes and the time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from corral import environment
from corral.contracts.logs import TRUNCATED_MARK, LogChunk

KIB = 1024
MIB = 1024 * KIB
#: How often at most a chunk that only reports dropped lines is sent (seconds).
DROPPED_NOTICE_EVERY = 1.0


@dataclass(frozen=True, slots=True)
class ShipLimits:
    """Per-rank shipping limits. Environment: CORRAL_LOG_<FIELD> upper-cased, e.g.
    CORRAL_LOG_RATE_BYTES=131072."""

    max_line_bytes: int = 8 * KIB
    max_chunk_bytes: int = 32 * KIB
    rate_bytes: int = 64 * KIB
    burst_bytes: int = 1 * MIB
    #: At most this much is read from the file per poll.
    max_read_bytes: int = 1 * MIB
    #: Unread output beyond this is skipped (the newest is shipped).
    max_backlog_bytes: int = 16 * MIB

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) <= 0:
                raise ValueError(f"log shipping limit {f.name} (CORRAL_LOG_{f.name.upper()}) must be > 0, "
                                 f"got {getattr(self, f.name)}")
        if self.max_line_bytes > self.max_chunk_bytes:
            raise ValueError(f"CORRAL_LOG_MAX_LINE_BYTES ({self.max_line_bytes}) must not exceed "
                             f"CORRAL_LOG_MAX_CHUNK_BYTES ({self.max_chunk_bytes}): a line must fit in a chunk")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ShipLimits:
        env = environment.mapping() if environ is None else environ
        values: dict[str, int] = {}
        for f in fields(cls):
            raw = env.get(f"CORRAL_LOG_{f.name.upper()}")
            if raw:
                try:
                    values[f.name] = int(raw)
                except ValueError:
                    raise ValueError(f"CORRAL_LOG_{f.name.upper()}={raw!r}: expected a whole number of bytes") from None
        return cls(**values)


@dataclass(slots=True)
class TokenBucket:
    """`rate` tokens per second, at most `burst` held; starts full."""

    rate: float
    burst: float
    tokens: float = -1.0
    at: float | None = None

    def __post_init__(self) -> None:
        if self.tokens < 0:
            self.tokens = self.burst

    def take(self, n: float, now: float) -> bool:
        """Spend `n` tokens if there are that many (after refilling up to `now`)."""
        if self.at is not None and now > self.at:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now if self.at is None else max(self.at, now)
        if n > self.tokens:
            return False
        self.tokens -= n
        return True


@dataclass(frozen=True, slots=True)
class Line:
    """One line of the file: its text (without the newline), and where its bytes are."""

    text: str
    truncated: bool
    start: int
    end: int  # after its newline (or after its last byte, for a final partial line)


@dataclass(slots=True)
class LineSplitter:
    """Bytes from `position` on -> whole lines. A line longer than `max_line` is cut there (the rest
    is skipped up to its newline); a partial last line is held until its newline or `flush`.
    `discarding`: the first bytes fed are the tail of a line already started (after a skip)."""

    position: int
    max_line: int
    discarding: bool = False
    _pending: bytearray = field(default_factory=bytearray)
    _start: int = -1

    def feed(self, data: bytes) -> list[Line]:
        lines: list[Line] = []
        i = 0
        while i < len(data):
            newline = data.find(b"\n", i)
            piece = data[i:] if newline < 0 else data[i:newline]
            if self._start < 0:
                self._start = self.position
            self.position += len(piece) + (newline >= 0)
            i = len(data) if newline < 0 else newline + 1
            if self.discarding:
                if newline >= 0:
                    self.discarding = False
                    self._start = -1
                continue
            room = self.max_line - len(self._pending)
            self._pending += piece[:room]
            if len(piece) > room:  # too long: cut here and skip the rest of the line
                lines.append(self._take(truncated=True))
                self.discarding = newline < 0
                if newline >= 0:
                    self._start = -1
            elif newline >= 0:
                lines.append(self._take(truncated=False))
        return lines

    def flush(self) -> list[Line]:
        """The held partial line, as a line (the file ends here)."""
        if self._start < 0 or self.discarding or not self._pending:
            self._start, self.discarding = -1, False
            return []
        return [self._take(truncated=False)]

    def _take(self, *, truncated: bool) -> Line:
        text = bytes(self._pending).decode(errors="replace") + (TRUNCATED_MARK if truncated else "")
        line = Line(text, truncated, self._start, self.position)
        self._pending.clear()
        self._start = -1
        return line


def attempt_header(job_id: str, attempt: int, rank: int) -> bytes:
    """How the stepd's header line of one attempt of a rank starts (`stepd.StepDaemon.spawn`)."""
    return f"==== corral job {job_id} attempt {attempt} rank {rank} ".encode()


def find_attempt_start(tail: bytes, tail_offset: int, job_id: str, attempt: int, rank: int) -> int | None:
    """Where the newest header of `attempt` starts in the file, searching `tail` (the file's bytes
    from `tail_offset`); None if it is not there."""
    header = attempt_header(job_id, attempt, rank)
    at = tail.rfind(header)
    while at >= 0:
        if (at == 0 and tail_offset == 0) or (at > 0 and tail[at - 1:at] == b"\n"):
            return tail_offset + at
        at = tail.rfind(header, 0, at)
    return None


def _other_attempt(line: Line, job_id: str, attempt: int, rank: int) -> bool:
    prefix = f"==== corral job {job_id} attempt "
    if not line.text.startswith(prefix):
        return False
    return not line.text.startswith(attempt_header(job_id, attempt, rank).decode())


@dataclass(frozen=True, slots=True)
class Read:
    """What to read next: `length` bytes from `offset`; `skipped` bytes before it left unread."""

    offset: int
    length: int
    skipped: int


class RankCursor:
    """Ships one rank's output of one attempt: which bytes to read next (`next_read`), and the
    chunks they make (`take`). `shipped` is where the last chunk ended: a new cursor started there
    (after an agent restart) ships on without gaps or repeats."""

    def __init__(self, job_id: str, attempt: int, node: str, rank: int, start: int, limits: ShipLimits) -> None:
        self.job_id, self.attempt, self.node, self.rank = job_id, attempt, node, rank
        self.limits = limits
        self.shipped = start
        self.ended = False  # another attempt's header reached: nothing more of this attempt
        self._splitter = LineSplitter(start, limits.max_line_bytes)
        self._bucket = TokenBucket(rate=limits.rate_bytes, burst=limits.burst_bytes)
        self._covered = start  # the end of the last line taken (shipped or dropped)
        self._dropped = 0
        self._skipped = 0
        self._last_sent: float | None = None

    @property
    def read_position(self) -> int:
        return self._splitter.position

    def next_read(self, file_size: int) -> Read:
        """The next bytes to read of a file now `file_size` long. A backlog larger than
        `max_backlog_bytes` is skipped but for its newest `max_read_bytes`; a file shorter than
        what was read (truncated or replaced) is read again from its start."""
        position = self._splitter.position
        if file_size < position:
            self._splitter = LineSplitter(0, self.limits.max_line_bytes)
            self.shipped = self._covered = position = 0
        backlog = file_size - position
        if backlog > self.limits.max_backlog_bytes:
            skip_to = file_size - self.limits.max_read_bytes
            self._skipped += skip_to - position
            self._splitter = LineSplitter(skip_to, self.limits.max_line_bytes, discarding=True)
            return Read(skip_to, self.limits.max_read_bytes, skip_to - position)
        return Read(position, min(backlog, self.limits.max_read_bytes), 0)

    def take(self, data: bytes, now: float, *, final: bool = False) -> list[LogChunk]:
        """The chunks to publish for `data` (the bytes `next_read` named). `final`: the rank has
        exited and `data` reaches the end of its file: the last chunk is marked final."""
        if self.ended:
            return []
        lines = self._splitter.feed(data)
        if final:
            lines += self._splitter.flush()
        chunks: list[LogChunk] = []
        batch: list[Line] = []
        size = 0
        for line in lines:
            if _other_attempt(line, self.job_id, self.attempt, self.rank):
                self.ended = True
                final = True
                break
            cost = len(line.text.encode()) + 1
            if batch and size + cost > self.limits.max_chunk_bytes:
                chunks.append(self._chunk(batch, now))
                batch, size = [], 0
            if self._bucket.take(cost, now):
                batch.append(line)
                size += cost
            else:
                self._dropped += 1
            self._covered = line.end
        quiet = self._last_sent is not None and now - self._last_sent < DROPPED_NOTICE_EVERY
        if batch or final or self._skipped or (self._dropped and not quiet):
            chunks.append(self._chunk(batch, now, final=final))
        return chunks

    def _chunk(self, batch: list[Line], now: float, *, final: bool = False) -> LogChunk:
        chunk = LogChunk(job_id=self.job_id, attempt=self.attempt, node=self.node, rank=self.rank,
                         offset=self.shipped, end=max(self._covered, self.shipped), lines=[line.text for line in batch],
                         truncated=sum(line.truncated for line in batch), dropped=self._dropped,
                         skipped_bytes=self._skipped, final=final, at=now)
        self.shipped = chunk.end
        self._dropped = self._skipped = 0
        self._last_sent = now
        return chunk
