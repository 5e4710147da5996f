"""launch.json across agent versions: one attempt numbering (from 0), old files read back into it."""

from __future__ import annotations

from pathlib import Path

from corral.services.node_agent.process.assignment import Assignment, RankAssignment
from corral.services.node_agent.process.step_files import STATE_VERSION, Launch


def assignment(attempt: int) -> Assignment:
    return Assignment(job_id="j", attempt=attempt, world_size=1, node_rank=0, master_addr="127.0.0.1",
                      master_port=29500, ranks=(RankAssignment(0, 0, (0,)),), command=("true",),
                      checkpoint_dir=Path("/c"), log_dir=Path("/l"))


def test_a_launch_round_trips_with_the_attempt_events_carry() -> None:
    launch = Launch(assignment(0), cause=None, kill_grace=5.0, launched_at=1.0)
    data = launch.to_json()
    assert data["version"] == STATE_VERSION == 2 and data["assignment"]["attempt"] == 0
    assert Launch.from_json(data).assignment.attempt == 0


def test_a_version_1_launch_counted_from_1_is_read_as_attempt_minus_1() -> None:
    """A stepd started by an agent of before (attempts from 1), adopted by this one after an upgrade."""
    data = Launch(assignment(1), cause=None, kill_grace=5.0, launched_at=1.0).to_json()
    data["version"] = 1
    assert Launch.from_json(data).assignment.attempt == 0
