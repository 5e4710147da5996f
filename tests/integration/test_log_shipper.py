"""The node agent's log shipper against a real nats-server: a rank's file from its attempt's header
to its exit, read back with `corral.log_stream`; a restarted shipper ships on without repeats; a
symlink is never read."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path

from corral.bus import Bus, Outgoing
from corral.contracts.logs import LogChunk
from corral.log_stream import LogQuery, read_chunks
from corral.services.node_agent.reporting.log_chunks import ShipLimits
from corral.services.node_agent.reporting.log_shipper import LogShipper, RankKey


def _shipper(bus: Bus, poll: float = 0.05) -> LogShipper:
    async def publish(subject: str, data: bytes, msg_id: str) -> None:
        await bus.publish(subject, data, msg_id, timeout=5.0)

    async def publish_many(messages: Sequence[Outgoing]) -> None:
        await bus.publish_many(messages, timeout=5.0)

    return LogShipper(publish, bus.names.name, publish_many=publish_many, limits=ShipLimits(), poll=poll)


async def _read(bus: Bus, job: str, attempt: int | None = None) -> list[LogChunk]:
    chunks: list[LogChunk] = []
    await read_chunks(bus, LogQuery(job, attempt), chunks.append)
    return chunks


def _open_files() -> set[str]:
    """The files this process holds open."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return found


def _header(job: str, attempt: int) -> bytes:
    return f"==== corral job {job} attempt {attempt} rank 0 node_rank 0 started now ====\n".encode()


async def test_one_attempt_is_shipped_from_its_header_to_the_exit_and_a_restart_repeats_nothing(
        bus: Bus, tmp_path: Path) -> None:
    log = tmp_path / "logs" / "j1" / "rank-0.log"
    log.parent.mkdir(parents=True)
    before = _header("j1", 0) + b"first try\n==== exited with code 3 ====\n"
    log.write_bytes(before + _header("j1", 1) + b"one\n")
    state = tmp_path / "state"
    key = RankKey("j1", 1, "node-0", 0)

    shipper = _shipper(bus)
    shipper.follow(key, log, state)
    for _ in range(100):  # shipped while the rank runs
        if await _read(bus, "j1"):
            break
        await asyncio.sleep(0.05)
    assert [line for c in await _read(bus, "j1") for line in c.lines][1:] == ["one"]
    with log.open("ab") as f:
        f.write(b"two\nthree")
    assert await shipper.drain(key, log, state, timeout=10)
    lines = [line for c in await _read(bus, "j1") for line in c.lines]
    assert lines == [_header("j1", 1).decode().strip(), "one", "two", "three"]

    again = _shipper(bus)  # an agent restarted: adoption reports the rank again
    assert await again.drain(key, log, state, timeout=10)
    assert [line for c in await _read(bus, "j1") for line in c.lines] == lines
    chunks = await _read(bus, "j1", attempt=1)
    assert chunks[-1].final and chunks[0].offset == len(before)
    assert await _read(bus, "j1", attempt=0) == []
    await shipper.close()
    await again.close()


async def test_a_cursor_kept_in_the_earlier_folder_is_shipped_on_from(bus: Bus, tmp_path: Path) -> None:
    """An agent that finds a rank's cursor only where cursors were kept apart (`logship/`) ships
    on from it, and keeps the next one in the attempt's run folder."""
    log = tmp_path / "logs" / "j2" / "rank-0.log"
    log.parent.mkdir(parents=True)
    shipped = _header("j2", 0) + b"already shipped\n"
    log.write_bytes(shipped + b"new\n")
    run, earlier = tmp_path / "run", tmp_path / "logship"
    (earlier / "j2" / "attempt-0").mkdir(parents=True)
    (earlier / "j2" / "attempt-0" / "rank-0.json").write_text(
        f'{{"start": 0, "shipped": {len(shipped)}, "done": false}}')
    (run / "j2" / "attempt-0").mkdir(parents=True)

    shipper = _shipper(bus)
    assert await shipper.drain(RankKey("j2", 0, "node-0", 0), log, run, timeout=10, earlier=earlier)
    chunks = await _read(bus, "j2")
    assert [line for c in chunks for line in c.lines] == ["new"] and chunks[0].offset == len(shipped)
    assert '"done": true' in (run / "j2" / "attempt-0" / "rank-0.json").read_text()
    await shipper.close()


async def test_a_symlink_in_place_of_the_log_is_never_read(bus: Bus, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(_header("j2", 0).decode() + "password\n")
    link = tmp_path / "rank-0.log"
    os.symlink(secret, link)
    shipper = _shipper(bus)
    assert await shipper.drain(RankKey("j2", 0, "node-0", 0), link, tmp_path / "state", timeout=10)
    assert await _read(bus, "j2") == []


async def test_lines_wait_for_a_log_stream_created_late(nats_url: str, namespace: str, tmp_path: Path) -> None:
    """Services of an older version never create the log stream: the agent runs on, its ranks'
    lines wait and land once the stream exists."""
    bus = await Bus.connect(nats_url, namespace)
    try:
        log = tmp_path / "rank-0.log"
        log.write_bytes(_header("j3", 0) + b"patience\n")
        shipper = _shipper(bus)
        key = RankKey("j3", 0, "node-0", 0)
        assert not await shipper.drain(key, log, tmp_path / "state", timeout=0.5)  # no stream: waiting
        # waiting, it holds no descriptor of the file (one per rank, without end, before) and says
        # it is failing, so exits are reported without waiting for their last chunks
        assert shipper.failing and str(log) not in _open_files()
        await bus.ensure_streams()
        for _ in range(100):
            if await _read(bus, "j3"):
                break
            await asyncio.sleep(0.1)
        assert [line for c in await _read(bus, "j3") for line in c.lines][1:] == ["patience"]
        await shipper.close()
    finally:
        await bus.close()


async def test_output_a_node_publishes_for_a_rank_it_did_not_run_is_skipped_and_said(bus: Bus) -> None:
    """The review: a node agent may publish log chunks on its own node's subjects, but for any job;
    `corral logs` showed node-x's forged lines as the job's rank 0. Chunks are now checked against
    the job's placements (its GangReserved events), read again for an attempt not seen yet."""
    from corral.contracts.events import GangReserved, RankPlacement
    from corral.contracts.logs import chunk_msg_id, encode_chunk, log_subject
    from corral.log_stream import RanksPlaced

    def chunk(node: str, attempt: int, line: str) -> LogChunk:
        return LogChunk(job_id="jlog", attempt=attempt, node=node, rank=0, offset=0, end=len(line) + 1, lines=[line])

    for c in (chunk("node-0", 0, "real"), chunk("node-x", 0, "forged"), chunk("node-1", 1, "second attempt")):
        await bus.publish(log_subject(bus.names.name, c.job_id, c.attempt, c.node, c.rank), encode_chunk(c),
                          chunk_msg_id(c), timeout=5.0)
    placements = [GangReserved.new(stream="job-jlog", actor="placement", job_id="jlog", world_size=1,
                                   master_addr="127.0.0.1", master_port=29500, attempt=0,
                                   ranks=[RankPlacement(rank=0, node="node-0", gpus=[0])])]
    reads: list[int] = []

    async def read() -> list[GangReserved]:
        reads.append(len(placements))
        return list(placements)

    now = [0.0]
    placed = RanksPlaced(read, lambda: now[0])
    shown: list[LogChunk] = []
    said: list[str] = []
    await read_chunks(bus, LogQuery("jlog"), shown.append, on_refused=said.append, placed=placed)
    assert [c.lines for c in shown] == [["real"]]
    assert any("node-x published as attempt 0 rank 0" in s and "ran on node-0" in s for s in said), said
    assert any("attempt 1 rank 0" in s and "no placement" in s for s in said), said
    # attempt 1 is placed later (following): read again, at most once a second
    placements.append(GangReserved.new(stream="job-jlog", actor="placement", job_id="jlog", world_size=1,
                                       master_addr="127.0.0.1", master_port=29500, attempt=1,
                                       ranks=[RankPlacement(rank=0, node="node-1", gpus=[0])]))
    now[0] = 5.0
    shown.clear()
    await read_chunks(bus, LogQuery("jlog", attempt=1), shown.append, placed=placed)
    assert [c.lines for c in shown] == [["second attempt"]] and len(reads) == 2


async def test_a_rank_that_ends_within_the_first_poll_is_shipped_as_one_final_chunk(
        bus: Bus, tmp_path: Path) -> None:
    """A short job costs one publish (and one cursor write), not one per look at its file."""
    log = tmp_path / "logs" / "j2" / "rank-0.log"
    log.parent.mkdir(parents=True)
    log.write_bytes(_header("j2", 0) + b"done\n==== exited with code 0 ====\n")
    key = RankKey("j2", 0, "node-0", 0)
    shipper = _shipper(bus, poll=30.0)
    shipper.follow(key, log, tmp_path / "state")
    await asyncio.sleep(0.2)  # the rank runs: nothing is read yet
    assert await shipper.drain(key, log, tmp_path / "state", timeout=10)
    [chunk] = await _read(bus, "j2")
    assert chunk.final and chunk.lines[1:] == ["done", "==== exited with code 0 ===="]
    await shipper.close()


def _following_header_only(bus: Bus, tmp_path: Path, job: str) -> tuple[Path, RankKey, LogShipper]:
    """A shipper following rank 0 of `job` whose log holds the stepd's header line only."""
    log = tmp_path / "logs" / job / "rank-0.log"
    log.parent.mkdir(parents=True)
    log.write_bytes(_header(job, 0))
    key = RankKey(job, 0, "node-0", 0)
    shipper = _shipper(bus, poll=0.02)
    shipper.follow(key, log, tmp_path / "state")
    return log, key, shipper


async def test_a_running_ranks_header_alone_waits_for_its_output_or_its_exit(
        bus: Bus, tmp_path: Path, monkeypatch: object) -> None:
    """The stepd's header line is not published alone while the rank runs (for up to
    `HEADER_ALONE`): a short silent job is one chunk at its exit, not the header's and the end's;
    once the rank writes, the header goes with its output."""
    from corral.services.node_agent.reporting import log_shipper

    log, key, shipper = _following_header_only(bus, tmp_path, "j3")
    await asyncio.sleep(0.3)  # many looks: the header alone is not shipped
    assert await _read(bus, "j3") == []
    with log.open("ab") as f:
        f.write(b"==== exited with code 0 ====\n")
    assert await shipper.drain(key, log, tmp_path / "state", timeout=10)
    [chunk] = await _read(bus, "j3")
    assert chunk.final and chunk.lines == [_header("j3", 0).decode().strip(), "==== exited with code 0 ===="]
    await shipper.close()

    monkeypatch.setattr(log_shipper, "HEADER_ALONE", 0.0)  # type: ignore[attr-defined]
    *_, again = _following_header_only(bus, tmp_path, "j4")
    for _ in range(200):  # a long silent rank: its header shows after HEADER_ALONE
        if await _read(bus, "j4"):
            break
        await asyncio.sleep(0.05)
    [first] = await _read(bus, "j4")
    assert not first.final and first.lines == [_header("j4", 0).decode().strip()]
    await again.close()
