"""Quota gives quota back on every reconcile, while a reservation round runs beside the loop.

The problem (bench/kueue_baseline.py, 15,000 jobs): a reservation round over a backlog of thousands
took seconds on the event loop, and the loop then waited as long again (four times after a slow
round): a job's quota was given back ~3 s after it ended and held 4.1 s for a 0.2 s job. Now the
round runs beside the loop (`Quota._round`), quota is given back meanwhile, and the next round
waits as long as the last one took. No NATS or Postgres: the steps are recorded, not run.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from corral.contracts import events as ev
from corral.contracts.envelope import Reason
from corral.contracts.jobspec import validate_job_spec
from corral.services.quota.service import Quota
from tests.unit.services.doubles import Clock, FoldingAppends
from tests.unit.services.job_events import job_event

SPEC = validate_job_spec({"name": "j", "queue": "a", "replicas": 1, "gpus_per_replica": 1, "runtime": "sim",
                          "duration_seconds": 1})


class RecordingQuota(Quota):
    """Quota whose steps are recorded; a round lasts until `gate` opens and takes `round_seconds`."""

    def __init__(self, clock: Clock, round_seconds: float = 2.0) -> None:
        stand_in: Any = object()
        super().__init__(stand_in, stand_in, clock=clock, monotonic=clock)
        self.steps: list[str] = []
        self.gate = asyncio.Event()
        self._clock, self.round_seconds = clock, round_seconds

    async def _release(self) -> None:
        self.steps.append("release")

    async def _escalate(self) -> None:
        self.steps.append("escalate")

    async def _reserve(self) -> None:
        self.steps.append("round starts")
        await self.gate.wait()
        self._clock.now += self.round_seconds
        self.steps.append("round ends")


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_quota_is_given_back_while_a_round_runs_and_rounds_are_paced() -> None:
    clock = Clock()
    quota = RecordingQuota(clock)
    assert Quota.paces_itself  # the run loop does not wait behind a round (see services/run_loop.py)
    await quota.reconcile()
    await settle()
    assert quota.steps == ["release", "escalate", "round starts"]
    quota.steps.clear()
    await quota.reconcile()  # a job ended during the round: its quota goes back at once
    assert quota.steps == ["release", "escalate"]
    quota.steps.clear()
    quota.changed.clear()
    quota.gate.set()
    await settle()
    assert quota.steps == ["round ends"] and quota.changed.is_set()  # the loop is woken
    quota.steps.clear()
    clock.now += 0.5  # sooner after the round than it took: quota is given back, no new round
    await quota.reconcile()
    await settle()
    assert quota.steps == ["release", "escalate"]
    quota.steps.clear()
    clock.now += 1.5
    await quota.reconcile()
    await settle()
    assert quota.steps == ["release", "escalate", "round starts", "round ends"]


async def test_a_paced_round_wakes_the_loop_when_it_is_due() -> None:
    clock = Clock()
    quota = RecordingQuota(clock, round_seconds=0.05)
    quota.gate.set()
    await quota.reconcile()
    await settle()
    await quota.reconcile()  # collects the ended round; too soon for the next: woken when due
    quota.changed.clear()
    await asyncio.wait_for(quota.changed.wait(), timeout=5)


async def test_a_round_starts_once_an_event_was_folded_and_at_most_every_round_interval() -> None:
    """Nothing folded since the last round's snapshot: no round until `round_refresh` after the
    last started (the clock's part). A folded event makes one due, no sooner than `round_interval`
    after the last started (a cheaper round under a stream of events otherwise ran more often)."""
    clock = Clock()
    quota = RecordingQuota(clock, round_seconds=0.001)
    quota.gate.set()
    await quota.reconcile()
    await settle()
    assert quota.steps.count("round starts") == 1
    clock.now += 0.2
    await quota.reconcile()  # collects the ended round; nothing folded since: no round
    await settle()
    assert quota.steps.count("round starts") == 1
    quota.folded(object())  # an event (of no job) was folded
    await quota.reconcile()
    await settle()
    assert quota.steps.count("round starts") == 2
    quota.folded(object())
    clock.now += 0.01  # sooner than round_interval after the last round started: not yet
    await quota.reconcile()
    await settle()
    assert quota.steps.count("round starts") == 2
    clock.now += Quota.round_interval
    await quota.reconcile()
    await settle()
    assert quota.steps.count("round starts") == 3
    clock.now += Quota.round_refresh  # nothing folded, but the clock moved on: a round
    await quota.reconcile()
    await settle()
    assert quota.steps.count("round starts") == 4


async def test_a_round_that_did_not_finish_is_followed_by_one_without_a_new_event() -> None:
    class Unavailable(Exception):
        pass

    class FailingOnce(RecordingQuota):
        failed = False

        async def _reserve(self) -> None:
            self.steps.append("round starts")
            if not self.failed:
                self.failed = True
                raise Unavailable("postgres is restarting")

    clock = Clock()
    quota = FailingOnce(clock)
    await quota.reconcile()
    await settle()
    with pytest.raises(Unavailable):
        await quota.reconcile()
    clock.now += 0.2
    await quota.reconcile()
    await settle()
    assert quota.steps.count("round starts") == 2


async def test_a_round_that_failed_is_raised_to_the_run_loop() -> None:
    class Unavailable(Exception):
        pass

    class Failing(RecordingQuota):
        async def _reserve(self) -> None:
            raise Unavailable("postgres is restarting")

    quota = Failing(Clock())
    await quota.reconcile()
    await settle()
    with pytest.raises(Unavailable):
        await quota.reconcile()


class AppendingQuota(FoldingAppends, Quota):
    """Quota whose appends are recorded (and fold, as a real append does), or lose a race."""

    def __init__(self) -> None:
        FoldingAppends.__init__(self, Clock(), Quota)


_job = job_event


def _holding_quota(job_id: str) -> list[Any]:
    from corral.contracts import events as ev
    from corral.contracts.jobspec import validate_job_spec

    spec = validate_job_spec({"name": job_id, "queue": "q", "gpus_per_replica": 2, "runtime": "sim",
                              "duration_seconds": 1})
    return [_job(job_id, ev.JobSubmitted, spec=spec), _job(job_id, ev.JobAdmitted, queue="q", priority=0, replicas=1,
                                                            gpus_per_replica=2),
            _job(job_id, ev.QuotaReserved, queue="q", gpus=2, borrowed=0)]


async def test_quota_is_given_back_for_the_jobs_an_event_touched_and_again_after_a_lost_race() -> None:
    """`_release` looks only at the jobs touched since it last ran (every reconcile scanned every
    active job: a tenth of quota's loop with thousands waiting), and a job it could not give back
    (a lost race) is looked at again without a new event."""
    from corral.contracts import events as ev

    quota = AppendingQuota()
    quota.fold(*_holding_quota("a"), *_holding_quota("b"))
    await quota._release()
    assert quota.appended_streams == [] and quota._touched == set(), "nothing ended: nothing to give back, nothing kept"
    quota.fold(_job("a", ev.JobCancelled, reason=ev.Reason(code="CANCELLED_BY_USER", message="bye")))
    quota.lose = True
    await quota._release()
    assert quota.appended_streams == [] and quota._touched == {"a"}
    quota.lose = False
    await quota._release()
    assert quota.appended_streams == [["job-a"]] and "a" in quota.view.forgotten  # over, its quota given back
    assert quota._touched == set() and quota.view.jobs["b"].quota_gpus == 2


async def test_a_rounds_own_reasons_make_no_round_due_and_its_reservations_do() -> None:
    """What a round records that changes no input of the next (the reasons jobs wait with) is not
    a change: the next round would decide the same and record nothing. A reservation it records is."""
    clock = Clock()
    quota = RecordingQuota(clock, round_seconds=0.001)
    quota.gate.set()
    job = "j1"
    for e in (job_event(job, ev.JobSubmitted, spec=SPEC, user="u"),
              job_event(job, ev.JobAdmitted, queue="a", priority=0, replicas=1, gpus_per_replica=1)):
        assert quota.view.apply(e) is not None
        quota.folded(e)
    await quota.reconcile()
    await settle()
    assert quota.steps.count("round starts") == 1
    waits = job_event(job, ev.PlacementPending, reason=Reason(code="MAX_GPUS_EXCEEDED", message="full"))
    quota._fold_appended({waits.stream: [waits]}, {waits.stream: quota.view.versions.get(waits.stream, 0)})
    assert quota.view.jobs[job].reason is not None and quota.view.jobs[job].reason.code == "MAX_GPUS_EXCEEDED"
    clock.now += Quota.round_interval
    await quota.reconcile()
    await settle()
    assert quota.steps.count("round starts") == 1  # its own reason: no round until the refresh
    quota.folded(waits)  # the same event folded from the bus (placement's reasons come so): a change
    await quota.reconcile()
    await settle()
    assert quota.steps.count("round starts") == 2
    clock.now += Quota.round_interval
    reserved = job_event(job, ev.QuotaReserved, queue="a", gpus=1, borrowed=0)
    quota._fold_appended({reserved.stream: [reserved]}, {reserved.stream: quota.view.versions.get(reserved.stream, 0)})
    await quota.reconcile()
    await settle()
    assert quota.steps.count("round starts") == 3
