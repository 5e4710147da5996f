"""An attempt's run folder goes once it is reported and the log holds the attempt's end; not before.

The attempts here ended while no agent ran (a state.json whose phase is ended, no stepd): adoption
reports them with no process to start, as after an agent restart.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from corral.services.node_agent.process import step_files
from corral.services.node_agent.process.assignment import Assignment, RankAssignment
from corral.services.node_agent.process.run_folders import REMOVED, RunFolders
from corral.services.node_agent.process.supervisor import GangOutcome, Supervisor


class Events:
    """The supervisor's callbacks; `gang_ended` returns once `published` is set (the reports out)."""

    def __init__(self, *, published: bool = True) -> None:
        self.published = asyncio.Event()
        if published:
            self.published.set()
        self.exits: list[tuple[str, int, int]] = []
        self.ended: list[GangOutcome] = []

    async def worker_started(self, job_id: str, rank: int, pid: int, attempt: int, **_: object) -> None:
        pass

    async def worker_exited(self, job_id: str, rank: int, exit_code: int | None, attempt: int, reason: object,
                            **_: object) -> None:
        self.exits.append((job_id, attempt, rank))

    async def checkpoint_done(self, *args: object, **_: object) -> None:
        pass

    async def gang_ended(self, outcome: GangOutcome) -> None:
        await self.published.wait()
        self.ended.append(outcome)


def assignment(run_dir: Path, job: str, attempt: int) -> Assignment:
    """One rank of `job`'s `attempt` on this node, running `true`."""
    return Assignment(job_id=job, attempt=attempt, world_size=1, node_rank=0, master_addr="127.0.0.1",
                      master_port=29500, ranks=(RankAssignment(0, 0, (0,)),), command=("true",),
                      checkpoint_dir=run_dir / "ck", log_dir=run_dir / "logs")


def ended_attempt(run_dir: Path, job: str, attempt: int, *, completed: bool = False) -> Path:
    """A folder left by an attempt whose one rank exited (0 if `completed`, else 1) while no agent ran."""
    a = assignment(run_dir, job, attempt)
    folder = step_files.attempt_dir(run_dir, job, attempt)
    folder.mkdir(parents=True, mode=0o711)
    launch = step_files.Launch(assignment=a, cause=None, kill_grace=1.0, launched_at=time.time())
    step_files.write_new_json(folder / step_files.LAUNCH, launch.to_json())
    now = time.time()
    state = {"version": step_files.STATE_VERSION, "job_id": job, "attempt": attempt, "phase": step_files.ENDED,
             "end": "completed" if completed else "failed", "checkpoints": [],
             "ranks": {"0": {"pid": None, "started_at": now, "exited_at": now, "exit_code": 0 if completed else 1,
                             "reason": "completed" if completed else "crashed", "cause": None}}}
    assert step_files.claim_state(folder, state)
    return folder


async def reported(events: Events, count: int = 1) -> None:
    """Until `count` gangs ended and were marked reported (right after `gang_ended` returns)."""
    for _ in range(500):
        if len(events.ended) >= count:
            await asyncio.sleep(0)
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the gang was not reported")


async def adopt_and_wait(sup: Supervisor, events: Events, over: Callable[[str, int], bool] | None = None) -> None:
    await sup.adopt(over)
    await reported(events)


async def test_an_ended_jobs_folder_goes_after_its_terminal_event(tmp_path: Path) -> None:
    folder = ended_attempt(tmp_path, "j", 0)
    events = Events()
    sup = Supervisor(events, tmp_path, base_env={})
    await adopt_and_wait(sup, events)
    assert step_files.is_reported(folder) and folder.is_dir()  # reported, but the log has not said it ended
    sup.attempts_over("j", None)  # JobCompleted
    assert not folder.exists()
    # a redelivered reservation of it is still known as launched here: not launched again
    assert sup.folders.launched_here("j", 0)
    assert not sup.folders.launched_here("other", 0)


async def test_a_completed_gangs_folder_goes_once_reported(tmp_path: Path) -> None:
    """No node is sent the log's end of a completed gang (its JobCompleted, its GangReleased)."""
    folder = ended_attempt(tmp_path, "j", 0, completed=True)
    events = Events(published=False)
    sup = Supervisor(events, tmp_path, base_env={})
    await sup.adopt()
    await asyncio.sleep(0.05)
    assert folder.is_dir()  # its reports are not all out: kept
    events.published.set()
    await reported(events)
    assert not folder.exists() and sup.folders.launched_here("j", 0)


async def test_a_terminal_event_before_the_report_removes_the_folder_once_reported(tmp_path: Path) -> None:
    folder = ended_attempt(tmp_path, "j", 0)
    events = Events(published=False)
    sup = Supervisor(events, tmp_path, base_env={})
    await sup.adopt()
    for _ in range(100):  # until its reports are being published
        if events.exits:
            break
        await asyncio.sleep(0.01)
    sup.attempts_over("j", None)
    await asyncio.sleep(0.05)
    assert folder.is_dir()  # its reports are not all out: kept
    events.published.set()
    await reported(events)
    assert not folder.exists()


async def test_a_folder_whose_exit_is_not_recorded_is_kept_and_adopted_after_a_restart(tmp_path: Path) -> None:
    folder = ended_attempt(tmp_path, "j", 0)
    events = Events(published=False)  # the bus does not take the reports
    sup = Supervisor(events, tmp_path, base_env={})
    await sup.adopt()
    sup.attempts_over("j", None)
    await asyncio.sleep(0.05)
    await sup.detach()  # the agent restarts before its reports were published
    assert folder.is_dir() and not step_files.is_reported(folder)

    again = Events()
    restarted = Supervisor(again, tmp_path, base_env={})
    await adopt_and_wait(restarted, again, over=lambda job, attempt: job == "j")
    assert again.exits == [("j", 0, 0)]  # the exit is reported by the next agent
    assert not folder.exists()  # reported, and the log says it is over


async def test_adoption_removes_reported_folders_of_attempts_over_and_keeps_the_others(tmp_path: Path) -> None:
    over = ended_attempt(tmp_path, "done", 0)
    released = ended_attempt(tmp_path, "requeued", 0)
    newer = ended_attempt(tmp_path, "requeued", 1)
    unknown = ended_attempt(tmp_path, "unknown", 0)
    completed = ended_attempt(tmp_path, "completed", 0, completed=True)
    for folder in (over, released, newer, unknown, completed):
        step_files.mark_reported(folder)
    sup = Supervisor(Events(), tmp_path, base_env={})
    adopted = await sup.adopt(lambda job, attempt: job == "done" or (job, attempt) == ("requeued", 0))
    assert adopted == []
    assert not over.exists() and not released.exists() and not completed.exists()
    assert newer.is_dir() and unknown.is_dir()
    assert sup.folders.launched_here("done", 0) and sup.folders.launched_here("requeued", 0)


async def test_a_release_removes_the_released_attempts_only(tmp_path: Path) -> None:
    first, second = ended_attempt(tmp_path, "j", 0), ended_attempt(tmp_path, "j", 1)
    for folder in (first, second):
        step_files.mark_reported(folder)
    sup = Supervisor(Events(), tmp_path, base_env={})
    sup.attempts_over("j", 0)  # GangReleased of attempt 0, or JobRequeued to attempt 1
    assert not first.exists() and second.is_dir()


async def test_a_removed_attempt_is_not_launched_again_by_the_next_agent(tmp_path: Path) -> None:
    """A completed attempt is reported and its folder removed; the agent restarts and its
    reservation comes again (its ack was lost): the restarted agent launches nothing."""
    folder = ended_attempt(tmp_path, "j", 0, completed=True)
    events = Events()
    sup = Supervisor(events, tmp_path, base_env={})
    await adopt_and_wait(sup, events)
    assert not folder.exists()
    await sup.detach()

    restarted = Supervisor(Events(), tmp_path, base_env={})
    try:
        assert await restarted.adopt() == []
        start = await restarted.start(assignment(tmp_path, "j", 0), wait=False)
        assert start.already_ended and restarted.running_jobs() == []
        assert not folder.exists()
        assert not (await restarted.start(assignment(tmp_path, "other", 0), wait=False)).already_ended
    finally:
        await restarted.close()


async def test_adoption_forgets_removed_attempts_whose_reservation_cannot_come_again(tmp_path: Path) -> None:
    """`redeliverable`: the reservations the agents' consumer may still deliver (not acknowledged,
    still in the stream); a removed attempt of any other is forgotten, on disk too."""
    for job in ("acked", "unacked"):
        ended_attempt(tmp_path, job, 0, completed=True)
    events = Events()
    sup = Supervisor(events, tmp_path, base_env={})
    await sup.adopt()
    await reported(events, 2)
    await sup.detach()

    restarted = Supervisor(Events(), tmp_path, base_env={})
    await restarted.adopt(redeliverable=lambda job, attempt: job == "unacked")
    assert restarted.folders.launched_here("unacked", 0) and not restarted.folders.launched_here("acked", 0)
    again = Supervisor(Events(), tmp_path, base_env={})
    await again.adopt()
    assert again.folders.launched_here("unacked", 0) and not again.folders.launched_here("acked", 0)


def test_the_removed_attempts_kept_on_disk_are_bounded(tmp_path: Path) -> None:
    """Between two restarts the record of removed attempts keeps the newest (`kept`) and a bounded file."""
    folders = RunFolders(tmp_path, kept=3)
    for i in range(10):
        folder = step_files.attempt_dir(tmp_path, f"j{i}", 0)
        folder.mkdir()
        folders.remove(f"j{i}", 0, folder)
    assert len((tmp_path / REMOVED).read_text().splitlines()) <= 6
    fresh = RunFolders(tmp_path, kept=3)
    assert [i for i in range(10) if fresh.launched_here(f"j{i}", 0)] == [7, 8, 9]
