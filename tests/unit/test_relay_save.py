"""The relay saves its position a while after a batch (`save_every`): every acknowledged batch's."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from corral.bus import OutboxRelay


class SlowSaves:
    """A store whose first save waits until let go."""

    def __init__(self) -> None:
        self.saved: list[int] = []
        self.saving = asyncio.Event()
        self.go = asyncio.Event()

    async def save_relay_position(self, name: str, position: int) -> None:
        if not self.saved and not self.saving.is_set():
            self.saving.set()
            await self.go.wait()
        self.saved.append(position)


async def test_a_batch_acknowledged_while_a_save_is_under_way_is_saved_after_it() -> None:
    store = SlowSaves()
    relay = OutboxRelay(cast(Any, store), cast(Any, None), lambda e: "s", save_every=0.01)
    relay._save_later(cast(Any, SimpleNamespace(position=1)))
    await asyncio.wait_for(store.saving.wait(), 5)
    relay._save_later(cast(Any, SimpleNamespace(position=2)))  # no batch comes after it
    store.go.set()
    for _ in range(100):
        if store.saved[-1:] == [2]:
            break
        await asyncio.sleep(0.01)
    assert store.saved == [1, 2]
    await relay.stop()
