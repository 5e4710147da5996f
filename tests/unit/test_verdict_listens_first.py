"""`read_verdict` listens for appends before its first look at the log: a verdict committed while
that look reads (the owner records it a few ms after the request is stored) wakes the pause after
the look, instead of the pause lasting its whole interval."""

from __future__ import annotations

from typing import Any

from corral.contracts import events as ev
from corral.contracts.envelope import job_stream
from corral.verdicts import VerdictKind, read_verdict


class Store:
    """The reads `read_verdict` makes, in order; the cancellation is handled at the second look."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def listen(self) -> None:
        self.calls.append("listen")

    async def was_processed(self, owner: str, msg_id: str) -> bool:
        self.calls.append("look")
        return self.calls.count("look") > 1

    async def read_stream(self, stream: str, after: int = 1) -> list[Any]:
        return []

    async def pause(self, seconds: float) -> None:
        self.calls.append("pause")


async def test_the_reader_listens_before_its_first_look() -> None:
    store = Store()
    request = ev.JobCancelRequested.new(stream=job_stream("j"), actor="user/a", job_id="j", user="a")
    verdict = await read_verdict(store, request, "k", 5)  # type: ignore[arg-type]
    assert verdict.kind is VerdictKind.UNCHANGED
    assert store.calls == ["listen", "look", "pause", "look"]
