"""`corral nodes`, `queues`, `events`, `replay` and `why` as functions over a client: the rows they
return from a log held in memory."""

from __future__ import annotations

import asyncio

import pytest

from corral.cli.commands import cluster as commands
from corral.cli.commands.jobs import why
from corral.contracts import events as ev
from corral.contracts.envelope import Reason
from tests.unit.cli.commands.fakes import FakeClient, run
from tests.unit.cli.commands.logs import (
    at,
    job_event,
    nodes,
    queues,
    running,
    submitted,
    two_nodes_one_running_one_pending,
)


@pytest.fixture
def c() -> FakeClient:
    return FakeClient(two_nodes_one_running_one_pending())


def test_nodes_are_picked_by_rack_and_state(c: FakeClient) -> None:
    every = run(commands.nodes(c))
    assert [r["node"] for r in every] == ["node-0", "node-1"]
    assert len(run(commands.nodes(c, rack=every[1]["rack"]))) == 2 and run(commands.nodes(c, rack="nope")) == []
    c.append(ev.NodeDrained.new(stream="node-node-1", actor="user/op", correlation_id="node-1", node="node-1",
                                user="op", message="", now=at(40)))
    assert [r["node"] for r in run(commands.nodes(c, state="draining"))] == ["node-1"]
    assert [r["node"] for r in run(commands.nodes(c, rack=every[1]["rack"], state="ready"))] == ["node-0"]


def test_queues_count_what_runs_and_what_waits(c: FakeClient) -> None:
    (q,) = run(commands.queues(c))
    assert (q["queue"], q["in_use"], q["pending"]) == ("q", 8, 1)


def test_events_of_a_job_of_some_types_the_newest_first_cut(c: FakeClient) -> None:
    rows = run(commands.events(c, commands.EventFilter(job="p"), 0))
    assert [r["type"] for r in rows] == ["JobSubmitted", "JobAdmitted", "PlacementPending"]
    assert rows[-1]["reason"] == "GANG_DOES_NOT_FIT: no room" and rows[-1]["job"] == "p"
    admitted = run(commands.events(c, commands.EventFilter(types=["JobAdmitted"]), 1))
    assert [(r["type"], r["job"]) for r in admitted] == [("JobAdmitted", "p")]
    late = run(commands.events(c, commands.EventFilter(start=at(15)), 0))
    assert {r["job"] for r in late} == {"p"}


def test_follow_returns_what_is_appended_after_the_position_it_is_given(c: FakeClient) -> None:
    async def first_batch() -> list[dict[str, object]]:
        following = commands.follow(c, commands.EventFilter(job="p"), len(c.log))
        c.append(job_event("r", ev.JobCompleted, 30))  # another job's: not kept
        c.append(job_event("p", ev.JobCancelled, 31, reason=Reason(code="CANCELLED_BY_USER", message="m")))
        return await asyncio.wait_for(anext(following), 5)

    (row,) = run(first_batch())
    assert row["type"] == "JobCancelled" and row["job"] == "p"


def test_replay_rebuilds_the_cluster_at_a_moment_from_the_log(c: FakeClient) -> None:
    before = run(commands.replay(c, at(15)))
    assert [j["id"] for j in before.jobs] == ["r"] and before.tree["version"] == 0
    assert before.state["nodes"]["node-0"]["allocations"]
    now = run(commands.replay(c, at(100)))
    assert [j["id"] for j in now.jobs] == ["p", "r"] and now.state["jobs"]["p"]["state"] == "PENDING"


def test_why_gives_the_trail_and_what_blocks_a_waiting_job(c: FakeClient) -> None:
    assert run(why(c, "nope", at(100).timestamp())) is None
    out = run(why(c, "p", at(100).timestamp()))
    assert out["state"] == "PENDING" and [s["event"] for s in out["trail"]] == [
        "JobSubmitted", "JobAdmitted", "PlacementPending"]
    assert out["blocker"]["code"] == "GANG_DOES_NOT_FIT" and "unblock" in out["blocker"]
    assert run(why(c, "r", at(100).timestamp()))["blocker"] is None


def test_why_tells_a_held_job_how_it_is_released(c: FakeClient) -> None:
    c.append(ev.JobHeld.new(stream="job-p", actor="user/op", correlation_id="p", job_id="p", user="op",
                            message="budget", now=at(40)))
    out = run(why(c, "p", at(100).timestamp()))
    assert out["state"] == "HELD" and out["blocker"]["unblock"] == "corral release p"


def test_why_and_show_say_a_job_quota_reserved_waits_for_placement_until_placement_says_why() -> None:
    """Placement says a job's first reason only after a grace (`services.placement.first_reason`):
    until then the fold says what is true (quota reserved it, at what time; placement has recorded
    no reason), never the reason it waited with before its reservation. Then placement's reason."""
    from corral.cli.present import job_detail, job_row

    events = [*nodes("1x8:H100"), *queues(), *running("r", "node-0", 10), *submitted("p", 20),
              job_event("p", ev.PlacementPending, 20.5, reason=Reason(code="MAX_GPUS_EXCEEDED", message="8 of 8")),
              job_event("p", ev.QuotaReserved, 21, queue="q", gpus=8, borrowed=0)]
    c = FakeClient(events)
    out = run(why(c, "p", at(21.2).timestamp()))
    assert out["state"] == "PENDING" and out["trail"][-1]["event"] == "QuotaReserved"
    blocker = out["blocker"]
    assert blocker["code"] == "QUOTA_RESERVED", blocker
    assert "quota reserved 8 GPUs at 2026-12-01T00:00:21.000Z" in blocker["message"]
    assert "placement has recorded no reason" in blocker["message"]
    job = run(c.job("p"))
    detail = job_detail(job)
    assert (detail["reason_code"], detail["reason_message"]) == (blocker["code"], blocker["message"])
    assert job_row(job)["reason"].startswith("QUOTA_RESERVED: quota reserved 8 GPUs")

    c.append(job_event("p", ev.PlacementPending, 22, reason=Reason(code="GANG_DOES_NOT_FIT", message="no room")))
    out = run(why(c, "p", at(22.5).timestamp()))
    assert (out["blocker"]["code"], out["blocker"]["message"]) == ("GANG_DOES_NOT_FIT", "no room")
    assert job_detail(run(c.job("p")))["reason_code"] == "GANG_DOES_NOT_FIT"
