"""Ship each rank's output to the bus, so `corral logs` works from any machine.

Why: `corral logs JOB` must work from any machine, each attempt apart, while each rank writes to
`<log_dir>/<job>/rank-<N>.log` on its node. The agent tails each rank's file while the rank runs and
publishes what it reads, within per-rank limits (`log_chunks`: truncated lines marked, a rate limit
whose drops are counted), to `<ns>.logs.user.<owner>.<job>.<attempt>.<node>.<rank>` on the stream
`<NS>_LOGS` (`corral.contracts.logs`): the owner is the user the job's JobSubmitted records
(`owner_of`), so that person may read it; a job whose owner the agent does not know (or cannot be a
subject token) goes to the version-1 subject without one, which only admins read. The full file
stays on the node.

How it hooks into the agent: `ShippingEvents` wraps the supervisor's `AgentEvents`: a rank that
starts (also one adopted after an agent restart) is followed from its attempt's header line in the
file; a rank that exits (or never started: its file says why) is drained to its end and its last
chunk marked final before its exit is reported (for up to `DRAIN_BEFORE_EXIT`), so a job seen
ended has its output on the bus. A running rank's header line alone waits for the rank's own
output (up to `HEADER_ALONE`): a short job's output is one publish. Where each rank got to is
appended to the attempt's `launch.json` in `<state_dir>` (a line naming the rank, see `_Saved`)
after every published chunk, so a restarted agent ships on from there (a chunk sent twice has the
same message id: the stream keeps one). The agent's `state_dir` is its run folder: the cursors
sit in the attempt's folder, which the supervisor has made before the rank starts (no file or
folder is made per rank; each costs the disk an inode). Cursor files of a rank's own
(`rank-<R>.json` there, or under an `earlier` folder, `logship/`, where agents kept them apart)
are read when launch.json has none. An unavailable bus is waited out: the file keeps the lines.

The file is opened without following a symlink and must be a regular file: the agent may be root,
and the file the rank's user's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from corral.bus import Outgoing
from corral.contracts.logs import LogChunk, chunk_msg_id, encode_chunk, log_subject

from ..process.step_files import (
    LAUNCH,
    NEVER_COMPACT,
    append_record,
    attempt_dir,
    last_record,
    nested_attempt_dir,
    read_file,
)
from ..process.supervisor import AgentEvents, ExitReason, GangOutcome
from .log_batches import ChunkBatches, PublishMany
from .log_chunks import RankCursor, ShipLimits, find_attempt_start

log = logging.getLogger("corral.node_agent.logs")

#: Publish one chunk: (subject, payload, message id); raises when it did not land.
Publish = Callable[[str, bytes, str], Awaitable[None]]

_HEADER_SEARCH = 64 * 1024 * 1024  # how far back from the end a rank's attempt header is looked for
_SEARCH_BLOCK = 1024 * 1024
_RETRY_CAP = 5.0
#: How long a rank's exit report waits for its last output to be published (seconds).
DRAIN_BEFORE_EXIT = 2.0
#: How long a running rank's header line waits for the rank's own output before it is published
#: alone (seconds): a short job's output is then one chunk, one publish and one cursor save, not
#: the header's and the rest's; a long silent one's header still shows within this.
HEADER_ALONE = 5.0


@dataclass(frozen=True, slots=True)
class RankKey:
    job_id: str
    attempt: int
    node: str
    rank: int


class _RankFile:
    """A rank's log file, open while it is read, let go while the bus does not take its chunks.

    A rank's shipping task does not hold its file open while it waits for the bus: on a cluster
    without the log stream (an agent upgraded before the services) every rank that ever ran would
    keep a descriptor, without end. A file let go is opened again (never through a symlink)
    where the chunks stopped; one gone meanwhile ends the shipping (the node keeps nothing more)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None

    def open(self) -> int | None:
        if self.fd is None:
            self.fd = _open_log(self.path)
        return self.fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _open_log(path: Path) -> int | None:
    """A read-only descriptor of a regular file at `path` (never through a symlink), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def _find_start(fd: int, key: RankKey) -> int | None:
    """Where this attempt's header starts, searching back from the end of the file."""
    size = os.fstat(fd).st_size
    end = size
    overlap = 256
    while end > 0 and size - end < _HEADER_SEARCH:
        begin = max(0, end - _SEARCH_BLOCK)
        found = find_attempt_start(os.pread(fd, end - begin + overlap, begin), begin, key.job_id, key.attempt,
                                   key.rank)
        if found is not None:
            return found
        end = begin
    return None


class _Saved:
    """The cursor of one rank: where shipping started and got to, and whether it is done.

    Kept as lines appended to `shared`, its attempt's launch.json (each naming its rank), where
    that file is: a file of the rank's own (`path`) is an inode per rank, which costs this kind of
    filesystem tenths of a millisecond. The stepd's readers skip these lines (launch.json's first
    line is the launch; state.json, the same inode once claimed, is its last state line). Without
    `shared` (no launch.json: not an attempt folder) a save goes to `path`. `path`, then `earlier`
    (where agents kept it apart), are read when `shared` holds none of the rank's."""

    def __init__(self, path: Path, earlier: Path | None = None, *, shared: Path | None = None,
                 rank: int | None = None) -> None:
        self.path = path
        self.earlier = earlier
        self.shared = shared
        self.rank = rank
        #: launch.json is there as the rank starts being followed: a save finding it gone finds the
        #: attempt's folder removed (reported and over, see `run_folders`), not yet to be made
        self._attempt_folder = shared is not None and shared.exists()

    def _mine(self, record: dict[str, object]) -> bool:
        return _is_cursor(record) and record.get("cursor_rank") == self.rank

    def load(self) -> dict[str, int | bool] | None:
        for path, valid in ((self.shared, self._mine), (self.path, _is_cursor), (self.earlier, _is_cursor)):
            if path is None:
                continue
            try:
                data = read_file(path)
                if _CURSOR_KEY not in data:  # launch.json of a rank not shipped yet: the launch and states alone
                    continue
                raw = last_record(data, valid)
                if raw is None:
                    continue
                return {"start": int(raw["start"]), "shipped": int(raw["shipped"]), "done": bool(raw.get("done"))}
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return None

    def save(self, start: int, shipped: int, done: bool) -> None:
        """The agent's own file among the stepd's (mode 0600): a rank running as its submitter
        passes through the attempt's folder but reads none of the agent's files. Each save is a
        line appended (the last complete one is the cursor): one inode per rank, not one per save."""
        record: dict[str, object] = {"start": start, "shipped": shipped, "done": done}
        if self.shared is not None:
            try:
                append_record(self.shared, {**record, "cursor_rank": self.rank}, compact_at=NEVER_COMPACT,
                              create=False)
                return
            except FileNotFoundError:
                if self._attempt_folder:
                    return
        try:
            append_record(self.path, record, compact_at=_CURSOR_COMPACT_AT)
        except FileNotFoundError:  # its folder is made on first use only (it is the attempt's, as a rule)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            append_record(self.path, record, compact_at=_CURSOR_COMPACT_AT)


_CURSOR_COMPACT_AT = 4096  # bytes of a cursor file past which a save replaces it by its newest line


_CURSOR_KEY = b'"shipped"'  # in every cursor record, as JSON writes it


def _is_cursor(record: dict[str, object]) -> bool:
    return "start" in record and "shipped" in record


class LogShipper:
    """Every rank this agent process ships: one task each, from `follow` until `finish` drained it.

    `publish` sends one chunk (`Bus.publish` with a timeout); `publish_many`, if given, several
    ranks' chunks at once (`Bus.publish_many`, see `log_batches`), `publish` then being what a rank
    falls back to when its batch fails; `prefix` is the namespace; `limits` apply to each rank;
    `poll` is how often a rank's file is looked at (seconds)."""

    def __init__(self, publish: Publish, prefix: str, *, publish_many: PublishMany | None = None,
                 limits: ShipLimits | None = None, poll: float = 0.5, clock: Callable[[], float] = time.time) -> None:
        self._publish = publish
        self._batches = ChunkBatches(publish_many) if publish_many is not None else None
        self._prefix = prefix
        self._limits = limits or ShipLimits.from_env()
        self._poll = poll
        self._clock = clock
        self._tasks: dict[RankKey, asyncio.Task[None]] = {}
        self._finishing: dict[RankKey, asyncio.Event] = {}
        #: the subject of each rank's chunks, fixed when it starts being followed
        self._subjects: dict[RankKey, Callable[[LogChunk], str]] = {}
        #: who owns a job (the user its JobSubmitted records): set by the agent host
        self.owner_of: Callable[[str], str | None] = lambda _job: None
        #: the last publish failed: an exit is then reported without waiting for its last chunks
        #: (each rank's exit waited `DRAIN_BEFORE_EXIT` for a bus that did not take them)
        self.failing = False

    def follow(self, key: RankKey, path: Path, state_dir: Path, earlier: Path | None = None) -> None:
        """Start shipping `key`'s output from `path` (idempotent); its cursor file is kept under
        `state_dir`, and read from under `earlier` when `state_dir` has none."""
        if key in self._tasks:
            return
        self._finishing[key] = asyncio.Event()
        self._subjects[key] = self._subject_for(self.owner_of(key.job_id))
        folder = attempt_dir(state_dir, key.job_id, key.attempt)
        if not os.path.isdir(folder):
            nested = nested_attempt_dir(state_dir, key.job_id, key.attempt)
            if os.path.isdir(nested):  # an attempt the nested layout holds
                folder = nested
        name = f"rank-{key.rank}.json"
        saved = _Saved(folder / name, None if earlier is None else nested_attempt_dir(earlier, key.job_id,
                                                                                      key.attempt) / name,
                       shared=folder / LAUNCH, rank=key.rank)
        task = asyncio.create_task(self._ship(key, path, saved), name=f"logs-{key.job_id}-{key.attempt}-{key.rank}")
        self._tasks[key] = task
        task.add_done_callback(lambda _: self._forget(key, task))

    def finish(self, key: RankKey, path: Path, state_dir: Path, earlier: Path | None = None) -> None:
        """The rank exited: ship what is left of its file, then stop (starts it if not followed)."""
        self.follow(key, path, state_dir, earlier)
        self._finishing[key].set()

    async def drain(self, key: RankKey, path: Path, state_dir: Path, timeout: float,
                    earlier: Path | None = None) -> bool:
        """`finish`, and wait up to `timeout` seconds for the rank's last chunk to be published;
        True if it was."""
        self.finish(key, path, state_dir, earlier)
        task = self._tasks.get(key)
        if task is None:
            return True
        done, _ = await asyncio.wait([task], timeout=timeout)
        return bool(done)

    def shipping(self) -> list[RankKey]:
        return sorted(self._tasks, key=lambda k: (k.job_id, k.attempt, k.node, k.rank))

    def _forget(self, key: RankKey, task: asyncio.Task[None]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
            self._finishing.pop(key, None)
            self._subjects.pop(key, None)

    def _subject_for(self, owner: str | None) -> Callable[[LogChunk], str]:
        if owner is not None:
            try:
                log_subject(self._prefix, "j", 0, "n", 0, owner=owner)
            except ValueError:
                log.warning("job owner %r cannot be a log subject token; its output goes to the admins' subject",
                            owner)
                owner = None
        return lambda c: log_subject(self._prefix, c.job_id, c.attempt, c.node, c.rank, owner=owner)

    async def close(self, grace: float = 2.0) -> None:
        """Let finishing ranks drain for up to `grace` seconds, then stop every task (their cursor
        files say where the next agent process ships on from)."""
        draining = [t for k, t in self._tasks.items() if self._finishing[k].is_set()]
        if draining:
            await asyncio.wait(draining, timeout=grace)
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._batches is not None:
            await self._batches.close()

    async def _ship(self, key: RankKey, path: Path, saved: _Saved) -> None:
        try:
            await self._ship_rank(key, path, saved)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug: say so, never take the agent down with it
            log.exception("shipping the output of %s attempt %d rank %d failed", key.job_id, key.attempt, key.rank)

    async def _ship_rank(self, key: RankKey, path: Path, saved: _Saved) -> None:
        before = saved.load()
        if before is not None and before["done"]:
            return
        finishing = self._finishing[key]
        file = _RankFile(path)
        fd = file.open()
        while fd is None:  # not there yet (or refused): look again until the rank ends
            if finishing.is_set():
                log.debug("%s: no regular file to ship the output of %s rank %d from", path, key.job_id, key.rank)
                return
            await asyncio.sleep(self._poll)
            fd = file.open()
        try:
            if before is not None:
                start, shipped = int(before["start"]), int(before["shipped"])
            else:
                found = _find_start(fd, key)
                if found is None:
                    log.warning("%s: no header of %s attempt %d rank %d; shipping its new output only", path,
                                key.job_id, key.attempt, key.rank)
                start = shipped = found if found is not None else os.fstat(fd).st_size
            cursor = RankCursor(key.job_id, key.attempt, key.node, key.rank, shipped, self._limits)
            await self._tail(file, cursor, finishing, lambda done: saved.save(start, cursor.shipped, done),
                             header_at=start)
        finally:
            file.release()

    async def _tail(self, file: _RankFile, cursor: RankCursor, finishing: asyncio.Event,
                    save: Callable[[bool], None], header_at: int = -1) -> None:
        if not finishing.is_set():  # the first look waits a poll, or the exit: a short rank is one chunk
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finishing.wait(), self._poll)
        alone_until = time.monotonic() + HEADER_ALONE
        while True:
            final = finishing.is_set()  # read before the file: what the rank wrote before exiting is there
            fd = file.open()
            if fd is None:
                log.warning("%s: gone while its chunks waited for the bus; the rest of %s rank %d is not shipped",
                            file.path, cursor.job_id, cursor.rank)
                return
            size = os.fstat(fd).st_size
            read = cursor.next_read(size)
            data = os.pread(fd, read.length, read.offset) if read.length else b""
            if (not final and cursor.shipped == header_at and _header_alone(data)
                    and time.monotonic() < alone_until):
                with contextlib.suppress(TimeoutError):  # nothing of the rank's own yet: look again
                    await asyncio.wait_for(finishing.wait(), self._poll)
                continue
            last = final and read.offset + len(data) >= size
            chunks = cursor.take(data, self._clock(), final=last)
            if chunks:  # the cursor moves past them once every one has landed
                await self._send_all(chunks, waiting=file.release)
                save(bool(chunks[-1].final))
            if cursor.ended or last:
                if not chunks:
                    save(True)
                return
            if not final or not data:
                with contextlib.suppress(TimeoutError):  # woken at once when the rank exits
                    await asyncio.wait_for(finishing.wait(), self._poll)

    def _message(self, chunk: LogChunk) -> Outgoing:
        subject_of = self._subjects.get(RankKey(chunk.job_id, chunk.attempt, chunk.node, chunk.rank))
        subject = subject_of(chunk) if subject_of else log_subject(self._prefix, chunk.job_id, chunk.attempt,
                                                                   chunk.node, chunk.rank)
        return Outgoing(subject, encode_chunk(chunk), chunk_msg_id(chunk))

    async def _send_all(self, chunks: list[LogChunk], waiting: Callable[[], None] = lambda: None) -> None:
        """Publish one rank's chunks, in order, until they land: in a batch with other ranks' when
        batches are on; if that batch fails, one by one (`_send`: a chunk already stored in the
        batch is acknowledged again as a duplicate of its message id, never stored twice)."""
        messages = [self._message(chunk) for chunk in chunks]
        if self._batches is not None:
            try:
                await self._batches.publish(messages)
                self.failing = False
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("a batch of log chunks with %s rank %d failed (%s: %s); publishing them alone",
                          chunks[0].job_id, chunks[0].rank, type(exc).__name__, exc)
        for chunk, message in zip(chunks, messages, strict=True):
            await self._send(chunk, message, waiting)

    async def _send(self, chunk: LogChunk, message: Outgoing, waiting: Callable[[], None]) -> None:
        """Publish until it lands: an unavailable bus is waited out (the file keeps the lines);
        `waiting` is called when it does not land at once (the rank's file is let go meanwhile)."""
        subject, data, msg_id = message.subject, message.data, message.msg_id
        delay = 0.25
        while True:
            try:
                await self._publish(subject, data, msg_id)
                self.failing = False
                if delay > 0.25:
                    log.info("log chunks of %s rank %d published again", chunk.job_id, chunk.rank)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failing = True
                waiting()
                # once per outage: one line per poll of every rank would bury the agent's own log
                (log.warning if delay == 0.25 else log.debug)(
                    "log chunk of %s rank %d not published (%s: %s); retrying until it is", chunk.job_id,
                    chunk.rank, type(exc).__name__, exc)
                await asyncio.sleep(delay)
                delay = min(_RETRY_CAP, delay * 2)


def _header_alone(data: bytes) -> bool:
    """Whether `data` is the attempt's header line and nothing else (the stepd's, see `stepd.spawn`)."""
    return data.startswith(b"==== corral job ") and data.endswith(b"\n") and data.count(b"\n") == 1


class ShippingEvents:
    """The supervisor's `AgentEvents`, passed on to `inner`, that also start and finish shipping
    each rank's output (`LogShipper`). `log_dir`: where the node's rank files are
    (`<log_dir>/<job>/rank-<N>.log`, `assignment.rank_log_path`); `state_dir`: the cursor files;
    `earlier`: where they may have been kept instead (see the module's docstring)."""

    def __init__(self, inner: AgentEvents, shipper: LogShipper, node: str, log_dir: Path, state_dir: Path,
                 earlier: Path | None = None) -> None:
        self.inner, self.shipper, self.node = inner, shipper, node
        self.log_dir, self.state_dir, self.earlier = log_dir, state_dir, earlier

    def _key(self, job_id: str, attempt: int, rank: int) -> RankKey:
        return RankKey(job_id, attempt, self.node, rank)

    def _path(self, job_id: str, rank: int) -> Path:
        return self.log_dir / job_id / f"rank-{rank}.log"

    async def worker_started(self, job_id: str, rank: int, pid: int, attempt: int, *, at: float,
                             cause: str | None) -> None:
        self.shipper.follow(self._key(job_id, attempt, rank), self._path(job_id, rank), self.state_dir, self.earlier)
        await self.inner.worker_started(job_id, rank, pid, attempt, at=at, cause=cause)

    async def worker_exited(self, job_id: str, rank: int, exit_code: int | None, attempt: int,
                            reason: ExitReason, *, at: float, cause: str | None, message: str = "") -> None:
        # The rank's last lines go out before its exit is reported: whoever sees the job end
        # (`corral submit --wait`, then `corral logs`) finds them on the bus.
        wait = 0.0 if self.shipper.failing else DRAIN_BEFORE_EXIT
        if not await self.shipper.drain(self._key(job_id, attempt, rank), self._path(job_id, rank),
                                        self.state_dir, wait, self.earlier):
            log.warning("%s rank %d: its last output is still being shipped as its exit is reported", job_id, rank)
        await self.inner.worker_exited(job_id, rank, exit_code, attempt, reason, at=at, cause=cause,
                                       message=message)

    async def checkpoint_done(self, job_id: str, path: Path, step: int, rank: int, attempt: int, *, at: float,
                              cause: str | None) -> None:
        await self.inner.checkpoint_done(job_id, path, step, rank, attempt, at=at, cause=cause)

    async def gang_ended(self, outcome: GangOutcome) -> None:
        await self.inner.gang_ended(outcome)
