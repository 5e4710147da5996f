"""`corral cancel JOB`: the request goes to admission, which decides whether there is such a job
and whether its sender may cancel it; the job is read only when the verdict changed nothing."""

from __future__ import annotations

from typing import Any

import pytest

from corral.cli.job_commands import cancel_job
from corral.contracts import events as ev
from corral.projection import JobView
from corral.verdicts import VerdictKind
from tests.unit.cli.commands.fakes import FakeClient, run
from tests.unit.cli.commands.logs import two_nodes_one_running_one_pending


class Counting(FakeClient):
    """Counts the reads of a job (each one a round trip to the read model)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.reads = 0

    async def job(self, job_id: str) -> JobView | None:
        self.reads += 1
        return await super().job(job_id)


def cancelled(c: Any, job: str) -> Any:
    return run(cancel_job(c, job, 1))


def test_a_pending_job_is_cancelled_with_one_request_and_no_read() -> None:
    c = Counting(two_nodes_one_running_one_pending())
    answered = cancelled(c, "p")
    assert answered is not None
    verdict, now = answered
    assert verdict.kind is VerdictKind.DONE and now == ""
    assert [type(r) for r in c.sent] == [ev.JobCancelRequested] and c.sent[0].job_id == "p"
    assert c.reads == 0


def test_an_unknown_job_is_asked_about_and_then_named() -> None:
    """Admission changes nothing for a job it does not know; the CLI then finds no such job."""
    c = Counting(two_nodes_one_running_one_pending(), answer=VerdictKind.UNCHANGED)
    assert cancelled(c, "nope") is None
    assert [getattr(r, "job_id", None) for r in c.sent] == ["nope"]


def test_a_job_id_no_job_can_have_is_no_job_and_sends_nothing() -> None:
    c = Counting(two_nodes_one_running_one_pending())
    assert cancelled(c, "not a job id") is None
    assert c.sent == []


@pytest.mark.parametrize("kind", [VerdictKind.UNCHANGED, VerdictKind.NO_VERDICT])
def test_a_verdict_that_changed_nothing_reads_what_the_job_is(kind: VerdictKind) -> None:
    c = Counting(two_nodes_one_running_one_pending(), answer=kind)
    answered = cancelled(c, "r")
    assert answered is not None
    verdict, now = answered
    assert verdict.kind is kind and now == "the job is RUNNING" and c.reads == 1


def test_no_verdict_on_an_unknown_job_names_no_job() -> None:
    c = Counting(two_nodes_one_running_one_pending(), answer=VerdictKind.NO_VERDICT)
    assert cancelled(c, "nope") is None


def test_a_refusal_comes_back_as_it_is() -> None:
    c = Counting(two_nodes_one_running_one_pending(), answer=VerdictKind.REFUSED)
    answered = cancelled(c, "p")
    assert answered is not None and answered[0].kind is VerdictKind.REFUSED and c.reads == 0
