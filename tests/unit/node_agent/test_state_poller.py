"""One poller for every gang's state file: a watcher wakes when its file changes or at its deadline,
and only then; a change is told by the kernel (inotify) where it can be, looked for on the timer
where not."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from corral.services.node_agent.process.inotify import DirWatch
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


needs_inotify = pytest.mark.skipif(DirWatch.open() is None, reason="no inotify here")


@needs_inotify
def test_a_change_wakes_its_watcher_at_once_without_a_look_on_the_timer(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("a\n")

    async def main() -> None:
        poller = StatePoller(60.0)  # the timer never looks in this test
        waiting = asyncio.create_task(poller.wait(str(path), file_version(path), timeout=60.0))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        with path.open("a") as f:
            f.write("b\n")
        await asyncio.wait_for(waiting, 5.0)

    asyncio.run(main())


@needs_inotify
def test_a_change_while_no_watcher_waits_returns_the_next_wait_at_once(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("a\n")

    async def main() -> None:
        poller = StatePoller(0.01)
        seen = file_version(path)
        await asyncio.wait_for(poller.wait(str(path), seen, timeout=0.05), 5.0)  # its deadline
        with path.open("a") as f:
            f.write("b\n")
        await asyncio.sleep(0.05)  # the change is read while nobody waits
        await asyncio.wait_for(poller.wait(str(path), seen, timeout=60.0), 5.0)

    asyncio.run(main())


@needs_inotify
def test_a_forgotten_folder_is_no_longer_watched_and_a_removed_one_is_dropped(tmp_path: Path) -> None:
    kept, gone = tmp_path / "kept", tmp_path / "gone"
    kept.mkdir()
    gone.mkdir()

    async def main() -> None:
        poller = StatePoller(0.01)
        for folder in (kept, gone):
            await poller.wait(str(folder / "state.json"), None, timeout=0.02)
        assert set(poller._folders) == {str(kept), str(gone)}
        poller.forget(str(kept / "state.json"))
        gone.rmdir()
        await asyncio.sleep(0.05)
        assert poller._folders == {} and poller._by_wd == {}

    asyncio.run(main())


@pytest.mark.parametrize("notify", [True, False])
def test_either_way_a_watcher_wakes_for_its_file_only(tmp_path: Path, notify: bool) -> None:
    mine, other = tmp_path / "state.json", tmp_path / "launch.json"
    mine.write_text("a\n")
    other.write_text("a\n")

    async def main() -> None:
        poller = StatePoller(0.01, notify=notify)
        waiting = asyncio.create_task(poller.wait(str(mine), file_version(mine), timeout=30.0))
        await asyncio.sleep(0.05)
        with other.open("a") as f:
            f.write("b\n")
        await asyncio.sleep(0.05)
        assert not waiting.done()
        mine.unlink()
        mine.write_text("a\n")  # a new file under the name: made
        await asyncio.wait_for(waiting, 2.0)

    asyncio.run(main())
