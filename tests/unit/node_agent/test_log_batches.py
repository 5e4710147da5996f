"""The log shipper's batches: ranks ending in step publish their chunks together; a batch the bus
refuses one chunk of still lands the others, and the refused rank retries alone, its cursor kept
before the chunk until it lands."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

from corral.bus import Outgoing
from corral.services.node_agent.reporting.log_chunks import ShipLimits
from corral.services.node_agent.reporting.log_shipper import LogShipper, RankKey


class FakeBus:
    """Stores by message id (as JetStream's duplicate window does); refuses the subjects in `refused`."""

    def __init__(self) -> None:
        self.stored: dict[str, bytes] = {}
        self.order: list[str] = []  # subjects, as stored
        self.batches: list[list[str]] = []
        self.alone: list[str] = []
        self.refused: set[str] = set()

    def _store(self, subject: str, data: bytes, msg_id: str) -> None:
        if msg_id not in self.stored:
            self.stored[msg_id] = data
            self.order.append(subject)

    async def publish(self, subject: str, data: bytes, msg_id: str) -> None:
        self.alone.append(subject)
        await asyncio.sleep(0)
        if subject in self.refused:
            raise TimeoutError("no ack")
        self._store(subject, data, msg_id)

    async def publish_many(self, messages: Sequence[Outgoing]) -> None:
        self.batches.append([m.subject for m in messages])
        await asyncio.sleep(0)
        for m in messages:  # stored in order up to the refused one; the batch then fails
            if m.subject in self.refused:
                raise TimeoutError("no ack")
            self._store(m.subject, m.data, m.msg_id)


def _rank(tmp_path: Path, job: str, body: bytes) -> Path:
    log = tmp_path / "logs" / job / "rank-0.log"
    log.parent.mkdir(parents=True)
    log.write_bytes(f"==== corral job {job} attempt 0 rank 0 node_rank 0 started now ====\n".encode() + body)
    return log


def _cursor(tmp_path: Path, job: str) -> dict[str, object] | None:
    path = tmp_path / "state" / f"{job}.attempt-0" / "rank-0.json"
    if not path.exists():
        return None
    return json.loads(path.read_text().splitlines()[-1])


def _shipper(fake: FakeBus) -> LogShipper:
    return LogShipper(fake.publish, "t", publish_many=fake.publish_many, limits=ShipLimits(), poll=30.0)


def _subject(job: str) -> str:
    return f"t.logs.{job}.0.n.0"


async def test_ranks_that_end_together_publish_in_one_batch(tmp_path: Path) -> None:
    fake = FakeBus()
    shipper = _shipper(fake)
    jobs = [f"j{i}" for i in range(5)]
    logs = {job: _rank(tmp_path, job, b"hello\n") for job in jobs}
    drained = await asyncio.gather(*(shipper.drain(RankKey(job, 0, "n", 0), logs[job], tmp_path / "state", 5.0)
                                     for job in jobs))
    assert all(drained)
    assert len(fake.batches) == 1 and len(fake.batches[0]) == 5 and fake.alone == []
    assert all(_cursor(tmp_path, job) == {"start": 0, "shipped": logs[job].stat().st_size, "done": True}
               for job in jobs)
    await shipper.close()


async def test_a_refused_chunk_holds_up_only_its_own_rank(tmp_path: Path, monkeypatch) -> None:
    fake = FakeBus()
    shipper = _shipper(fake)
    monkeypatch.setattr(shipper, "_subject_for", lambda owner: lambda c: f"t.logs.{c.job_id}.0.n.0")
    jobs = ["a", "b", "c"]
    logs = {job: _rank(tmp_path, job, b"line\n") for job in jobs}
    fake.refused.add(_subject("a"))  # first in the batch: nothing after it is stored by the batch
    keys = {job: RankKey(job, 0, "n", 0) for job in jobs}
    drained = await asyncio.gather(*(shipper.drain(keys[job], logs[job], tmp_path / "state", 1.0) for job in jobs))
    assert drained == [False, True, True]
    assert fake.batches == [[_subject(j) for j in jobs]]
    # b and c landed alone after the batch failed; only a keeps retrying, and its cursor waits
    assert set(fake.order) == {_subject("b"), _subject("c")}
    assert _cursor(tmp_path, "a") is None and shipper.failing
    assert sorted(fake.alone[:3]) == [_subject(j) for j in jobs]
    assert fake.alone[3:] and all(s == _subject("a") for s in fake.alone[3:])
    # a's next lines wait behind its refused chunk; once the bus takes it, a lands alone, in order
    fake.refused.clear()
    for _ in range(200):
        if _subject("a") in fake.order:
            break
        await asyncio.sleep(0.05)
    assert await shipper.drain(keys["a"], logs["a"], tmp_path / "state", 1.0)
    assert fake.order.count(_subject("a")) == 1 and len(fake.batches) == 1
    assert _cursor(tmp_path, "a") == {"start": 0, "shipped": logs["a"].stat().st_size, "done": True}
    assert not shipper.failing
    await shipper.close()


async def test_a_rank_whose_chunks_a_failed_batch_stored_is_not_stored_twice(tmp_path: Path, monkeypatch) -> None:
    fake = FakeBus()
    shipper = _shipper(fake)
    monkeypatch.setattr(shipper, "_subject_for", lambda owner: lambda c: f"t.logs.{c.job_id}.0.n.0")
    logs = {job: _rank(tmp_path, job, b"x\n") for job in ("a", "z")}
    fake.refused.add(_subject("z"))  # last in the batch: a is stored by the batch, then the batch fails
    await asyncio.gather(*(shipper.drain(RankKey(job, 0, "n", 0), logs[job], tmp_path / "state", 0.5)
                           for job in ("a", "z")))
    assert fake.order == [_subject("a")] and fake.alone[0] == _subject("a")  # published again: a duplicate
    await shipper.close()
