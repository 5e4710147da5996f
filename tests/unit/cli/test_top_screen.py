"""`corral top`'s frame: the data (its --json) and the screen drawn from it."""

from __future__ import annotations

from datetime import timedelta

from rich.console import Console

from corral.cli.top_screen import render, snapshot
from corral.contracts import events as ev
from corral.contracts.envelope import Reason, queue_stream
from corral.contracts.queues import QueueSpec
from tests.unit.cli.test_unblock_hint import T0, cluster, job_event, run, submit


def test_a_frame_shows_the_gpu_map_queues_against_their_due_and_why_jobs_wait() -> None:
    view = cluster("2x8:H100", [])
    for name in ("team-a", "team-b"):
        view.apply(ev.QueueConfigured.new(stream=queue_stream(name), actor="u", now=T0,
                                          queue=QueueSpec(name=name, guaranteed_gpus=8)))
    run(view, "jrun", "node-1", list(range(8)), None)  # a job of queue "q" (the helper's: guaranteed 16)
    submit(view, "jwait", "team-b", 2, 8)
    view.apply(job_event("jwait", ev.PlacementPending, reason=Reason(code="GANG_DOES_NOT_FIT", message="needs 16")))
    data = snapshot(view, T0 + timedelta(seconds=90))
    assert data["summary"]["gpus"] == 16 and data["summary"]["gpus_allocated"] == 8
    assert data["summary"]["jobs"]["running"] == 1 and data["summary"]["jobs"]["pending"] == 1
    assert [p["id"] for p in data["pending"]] == ["jwait"]
    assert data["pending"][0]["reason_code"] == "GANG_DOES_NOT_FIT" and data["pending"][0]["waiting"] == "90s"
    queues = {q["queue"]: q for q in data["queues"]}
    # team-a wants nothing; q's running job is within q's due, so team-b's due is the other 8 GPUs
    assert queues["team-b"]["pending"] == 1 and queues["team-b"]["fair_share"] == 8
    assert queues["q"]["fair_share"] == 8 and queues["team-a"]["fair_share"] == 0
    console = Console(width=100, record=True, color_system=None)
    console.print(render(data, 100))
    screen = console.export_text()
    for text in ("corral top", "GPUs 8/16 allocated", "node-1", "jrun", "team-b", "jwait", "GANG_DOES_NOT_FIT",
                 "FAIR SHARE"):
        assert text in screen, text
    assert max(len(line) for line in screen.splitlines()) <= 100


def test_a_frame_kept_while_the_log_is_unreachable_says_so() -> None:
    data = snapshot(cluster("1x8:H100", []), T0)
    console = Console(width=80, record=True, color_system=None)
    console.print(render(data, 80, note="the log is unreachable (ConnectionRefusedError); retrying"))
    screen = console.export_text()
    assert 0 < screen.index("the log is unreachable") < screen.index("Nodes") and "node-0" in screen
