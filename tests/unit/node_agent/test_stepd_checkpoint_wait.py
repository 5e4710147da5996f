"""A rank that reported its checkpoint gets a short while to exit by itself only when its whole gang
is on this node: ranks on other nodes may still be checkpointing, and it waits for them."""

from __future__ import annotations

import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from corral.services.node_agent.process import stepd
from corral.services.node_agent.process.assignment import Assignment, RankAssignment
from corral.services.node_agent.process.step_files import Launch


def _preempting(tmp_path: Path, group_world_size: int) -> tuple[stepd.Stepd, list[int]]:
    a = Assignment(job_id="j1", attempt=0, world_size=group_world_size, node_rank=0, master_addr="127.0.0.1",
                   master_port=29500, ranks=(RankAssignment(0, 0, (0,)),), command=("true",),
                   checkpoint_dir=tmp_path / "ckpt", log_dir=tmp_path / "logs", group_world_size=group_world_size)
    s = stepd.Stepd(tmp_path, Launch(assignment=a, cause=None, kill_grace=1.0, launched_at=0.0))
    sent: list[int] = []

    def record(rank: int, pgid: int, sig: int) -> None:
        sent.append(sig)

    s.signal = record  # type: ignore[method-assign]
    s.procs[0] = SimpleNamespace(pid=12345)  # type: ignore[assignment]
    s.preempt("SIGUSR1", 60.0, None, now=0.0)
    s.reported.add(0)
    return s, sent


def _escalate_until(s: stepd.Stepd, until: float) -> None:
    t = 0.0
    while t <= until:
        s.escalate(t)
        t += 0.25


def test_a_gang_all_on_this_node_is_termed_soon_after_every_rank_reported(tmp_path: Path) -> None:
    s, sent = _preempting(tmp_path, 1)
    _escalate_until(s, stepd.EXIT_AFTER_REPORT + 0.5)
    assert sent == [signal.SIGUSR1, signal.SIGTERM]


def test_a_rank_whose_peers_run_on_other_nodes_is_not_termed_while_they_may_still_checkpoint(tmp_path: Path) -> None:
    s, sent = _preempting(tmp_path, 2)
    _escalate_until(s, 30.0)
    assert sent == [signal.SIGUSR1]
    p: Any = s.preempting
    _escalate_until(s, p["term_at"] + 0.5)  # the grace's own SIGTERM still comes
    assert sent == [signal.SIGUSR1, signal.SIGTERM]


def test_a_gang_termed_during_a_preemption_waits_for_its_deadline_without_spinning(tmp_path: Path) -> None:
    """After the SIGTERM its term time is past: the stepd waits (a busy poll at most) until the
    deadline, not for no time at all over and over until then."""
    s, sent = _preempting(tmp_path, group_world_size=1)
    _escalate_until(s, 3.0)  # reported at 0: termed 2 s later
    assert signal.SIGTERM in sent and s.preempting is not None and not s.preempting["killed"]
    _escalate_until(s, 56.0)  # past its term time (55), before its deadline (60)
    assert s.timeout(56.0) >= stepd.POLL_BUSY
    _escalate_until(s, 61.0)  # the deadline: killed
    assert signal.SIGKILL in sent
    assert s.timeout(61.0) >= stepd.POLL_BUSY  # killed: it waits for the exits, not for a deadline gone by
