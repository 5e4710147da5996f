"""One poller for every gang's state file: a watcher wakes when its file changes or at its deadline,
and only then."""

from __future__ import annotations

import asyncio
from pathlib import Path

from corral.services.node_agent.process.state_poller import StatePoller
from corral.services.node_agent.process.step_files import file_version


def test_a_watcher_wakes_when_its_file_changes_and_not_for_another_file(tmp_path: Path) -> None:
    mine, other = tmp_path / "mine.json", tmp_path / "other.json"
    mine.write_text("a\n")
    other.write_text("a\n")

    async def main() -> None:
        poller = StatePoller(0.01)
        waiting = asyncio.create_task(poller.wait(str(mine), file_version(mine), timeout=30.0))
        await asyncio.sleep(0.05)
        with other.open("a") as f:
            f.write("b\n")
        await asyncio.sleep(0.05)
        assert not waiting.done()
        with mine.open("a") as f:
            f.write("b\n")
        await asyncio.wait_for(waiting, 2.0)

    asyncio.run(main())


def test_a_watcher_wakes_at_its_deadline_and_a_missing_file_that_appears_wakes_it(tmp_path: Path) -> None:
    missing = tmp_path / "state.json"

    async def main() -> None:
        poller = StatePoller.shared(0.01)
        assert StatePoller.shared(0.01) is poller
        loop = asyncio.get_running_loop()
        began = loop.time()
        await asyncio.wait_for(poller.wait(str(missing), None, timeout=0.1), 2.0)
        assert loop.time() - began >= 0.1
        waiting = asyncio.create_task(poller.wait(str(missing), None, timeout=30.0))
        await asyncio.sleep(0.03)
        missing.write_text("{}\n")
        await asyncio.wait_for(waiting, 2.0)

    asyncio.run(main())


def test_a_cancelled_watcher_is_dropped_and_the_poller_stops_when_none_waits(tmp_path: Path) -> None:
    path = tmp_path / "state.json"

    async def main() -> None:
        poller = StatePoller(0.01)
        waiting = asyncio.create_task(poller.wait(str(path), None, timeout=30.0))
        await asyncio.sleep(0.03)
        waiting.cancel()
        await asyncio.sleep(0.05)
        assert poller._waiters == [] and poller._task is None

    asyncio.run(main())
