"""`corral hold|release|requeue|drain|undrain` and `corral gpu drain`: a request the log already
shows cannot be acted on is refused before it is sent; else the owner's verdict comes back."""

from __future__ import annotations

import pytest

from corral.cli.commands import CommandError
from corral.cli.commands import operator as commands
from corral.contracts import events as ev
from corral.projection import ACTS_ON, JobState
from corral.verdicts import VerdictKind
from tests.unit.cli.commands.fakes import FakeClient, run
from tests.unit.cli.commands.logs import two_nodes_one_running_one_pending


@pytest.fixture
def c() -> FakeClient:
    return FakeClient(two_nodes_one_running_one_pending())


def test_a_pending_job_is_held_and_then_released(c: FakeClient) -> None:
    verdict, now = run(commands.hold(c, "p", release=False, message="dataset", waited=1))
    assert verdict.kind is VerdictKind.DONE and now == "the job is HELD"
    assert isinstance(c.sent[-1], ev.JobHeld) and c.sent[-1].message == "dataset"
    verdict, now = run(commands.hold(c, "p", release=True, message="", waited=1))
    assert isinstance(c.sent[-1], ev.JobHoldReleased) and now == "the job is PENDING"


@pytest.mark.parametrize(("job", "release", "words"), [
    ("r", False, "cannot hold r: it is RUNNING; only a waiting job is held"),
    ("p", True, "cannot release p: it is PENDING; only a held job is released"),
    ("nope", False, "no job 'nope'"),
])
def test_a_hold_or_release_the_job_cannot_take_is_not_sent(c: FakeClient, job: str, release: bool,
                                                           words: str) -> None:
    with pytest.raises(CommandError) as caught:
        run(commands.hold(c, job, release=release, message="", waited=1))
    assert caught.value.message.startswith(words) and c.sent == []


def test_a_running_job_is_requeued_and_a_pending_one_is_not(c: FakeClient) -> None:
    with pytest.raises(CommandError, match="cannot requeue p: it is PENDING"):
        run(commands.requeue(c, "p", message="", waited=1))
    assert c.sent == []
    verdict, _ = run(commands.requeue(c, "r", message="move", waited=1))
    assert verdict.kind is VerdictKind.DONE and isinstance(c.sent[-1], ev.JobRequeueRequested)


def test_the_verdict_that_changed_nothing_comes_back_with_the_job_as_it_is() -> None:
    c = FakeClient(two_nodes_one_running_one_pending(), answer=VerdictKind.UNCHANGED)
    verdict, now = run(commands.hold(c, "p", release=False, message="", waited=1))
    assert verdict.kind is VerdictKind.UNCHANGED and now == "the job is PENDING"


@pytest.mark.parametrize("state", list(JobState))
@pytest.mark.parametrize("request_type", [ev.JobHeld, ev.JobHoldReleased, ev.JobRequeueRequested])
def test_the_cli_sends_what_admission_acts_on(state: JobState, request_type: type) -> None:
    """One table (`projection.ACTS_ON`) for admission and the CLI's check: the CLI refuses before
    sending exactly what admission would record nothing for."""
    from unittest.mock import AsyncMock

    from corral.projection import JobView

    job = JobView(job_id="j", state=state)
    c = FakeClient()
    c.job = AsyncMock(return_value=job)  # type: ignore[method-assign]
    call = (commands.requeue(c, "j", message="", waited=1) if request_type is ev.JobRequeueRequested else
            commands.hold(c, "j", release=request_type is ev.JobHoldReleased, message="", waited=1))
    try:
        run(call)
        sent = True
    except CommandError:
        sent = False
    assert sent == (state in ACTS_ON[request_type])


def test_a_node_is_drained_only_if_the_log_knows_it(c: FakeClient) -> None:
    with pytest.raises(CommandError, match="no node 'node-9'"):
        run(commands.drain(c, "node-9", undrain=False, evict=True, message="", waited=1))
    assert c.sent == []
    verdict = run(commands.drain(c, "node-1", undrain=False, evict=True, message="fans", waited=1))
    assert verdict.kind is VerdictKind.DONE
    assert isinstance(c.sent[-1], ev.NodeDrained) and c.sent[-1].evict and c.sent[-1].node == "node-1"
    run(commands.drain(c, "node-1", undrain=True, evict=False, message="", waited=1))
    assert isinstance(c.sent[-1], ev.NodeUndrained)


def test_a_gpu_is_drained_only_if_its_node_has_it(c: FakeClient) -> None:
    with pytest.raises(CommandError, match=r"node node-1 has no GPU 8 \(its GPUs: 0-7\)"):
        run(commands.drain_gpu(c, "node-1", 8, undrain=False, message="", waited=1))
    with pytest.raises(CommandError, match="no node 'node-9'"):
        run(commands.drain_gpu(c, "node-9", 0, undrain=False, message="", waited=1))
    assert c.sent == []
    run(commands.drain_gpu(c, "node-1", 7, undrain=False, message="", waited=1))
    assert isinstance(c.sent[-1], ev.GpuDrained) and (c.sent[-1].node, c.sent[-1].gpu) == ("node-1", 7)
