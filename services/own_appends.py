"""The streams a service is appending to, until each append has returned and its batch is folded.

Why: a service folds its own batch when the append returns, and the bus may deliver a copy of an
event of that batch first (a type another service writes too, so this one is sent it: placement's
JobRequeued). A reader that is not sent every type folds a version past the next one (see
`ClusterView.apply`), so the copy would move the stream's version past the batch's earlier
events, and the fold of the batch would skip them as folded already: a job requeued whose gang
was never released. An event delivered on a stream being appended to waits for that append
(`settled`): then it is a duplicate of the batch just folded, or, if the append lost its race,
of the stream re-read from the log, or the next version after them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator


class Appending:
    """Which streams have an append of this process under way (usually none: one dict lookup)."""

    def __init__(self) -> None:
        self._streams: dict[str, list[asyncio.Event]] = {}

    @contextlib.contextmanager
    def on(self, streams: Iterable[str]) -> Iterator[None]:
        """Mark `streams` as being appended to for the block (the append, then its fold)."""
        done = asyncio.Event()
        held = list(streams)
        for stream in held:
            self._streams.setdefault(stream, []).append(done)
        try:
            yield
        finally:
            for stream in held:
                waits = self._streams[stream]
                waits.remove(done)
                if not waits:
                    del self._streams[stream]
            done.set()

    def busy(self, stream: str) -> bool:
        return stream in self._streams

    async def settled(self, stream: str) -> None:
        """Wait until no append of this process to `stream` is under way."""
        while (waits := self._streams.get(stream)):
            await waits[0].wait()


__all__ = ["Appending"]
