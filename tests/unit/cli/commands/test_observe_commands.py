"""`corral usage`, `corral top`'s view and `corral dlq` as functions over a client."""

from __future__ import annotations

import pytest

from corral.accounting import GroupBy, Window
from corral.cli.commands import CommandError
from corral.cli.commands import observe as commands
from corral.contracts import events as ev
from tests.unit.cli.commands.fakes import FakeClient, run
from tests.unit.cli.commands.logs import at, job_event, two_nodes_one_running_one_pending


def test_usage_is_a_row_per_queue_and_their_total() -> None:
    c = FakeClient(two_nodes_one_running_one_pending())
    rows, overall = run(commands.usage(c, Window(until=at(3600 + 12), since=None), GroupBy.QUEUE))
    assert [r.key for r in rows] == ["q"] and overall.key == "TOTAL" and overall.jobs == rows[0].jobs
    assert overall.used == pytest.approx(8.0, rel=0.01)  # r's 8 GPUs for an hour


def test_each_frame_of_top_reads_the_cluster_now() -> None:
    c = FakeClient(two_nodes_one_running_one_pending())
    assert run(commands.top_view(c)).jobs["r"].state.value == "RUNNING"
    c.append(job_event("r", ev.JobCompleted, 40))
    assert run(commands.top_view(c)).jobs["r"].state.value == "COMPLETED"


def test_a_dead_letter_replay_the_services_cannot_take_is_a_command_error() -> None:
    c = FakeClient(dead_letters=RuntimeError("no service answered the replay request"))
    with pytest.raises(CommandError, match="no service answered"):
        run(commands.replay_dead_letters(c, 3))
    letters = [{"seq": 3, "replayed": True}, {"seq": 4, "replayed": False}]
    assert run(commands.replay_dead_letters(FakeClient(dead_letters=letters), 4)) == [letters[1]]
