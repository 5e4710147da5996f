"""A node's heartbeats list a job until every report of it is published: a gang that ended on the
node but whose WorkerExited still waits in the report queue is not "gone without a word" (placement
would release and requeue it as WORKERS_LOST while its exit is on the way)."""

from __future__ import annotations

import asyncio

from corral.contracts.envelope import Event
from corral.services.node_agent.process.supervisor import ExitReason, GangEnd, GangOutcome
from corral.services.node_agent.reporting.reports import NodeReports


class HeldPublisher:
    """A report queue whose publications complete only when the test says so."""

    def __init__(self) -> None:
        self.held: list[asyncio.Future[None]] = []

    def send(self, event: Event) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.held.append(done)
        return done

    def publish_all(self) -> None:
        for done in self.held:
            if not done.done():
                done.set_result(None)


async def test_a_job_is_listed_until_its_last_report_is_published() -> None:
    publisher = HeldPublisher()
    reports = NodeReports("n1", publisher)  # type: ignore[arg-type]
    await reports.worker_started("j1", 0, 4242, 0, at=1.0, cause=None)
    assert reports.unpublished_jobs() == {"j1"}
    publisher.publish_all()
    assert reports.unpublished_jobs() == set()
    await reports.worker_exited("j1", 0, 0, 0, ExitReason.COMPLETED, at=2.0, cause=None)
    outcome = GangOutcome(job_id="j1", attempt=0, end=GangEnd.COMPLETED, exits={0: 0}, checkpoint=None,
                          resume_from=None)
    ended = asyncio.create_task(reports.gang_ended(outcome))
    await asyncio.sleep(0)
    assert not ended.done() and reports.unpublished_jobs() == {"j1"}, "its exit waits in the queue: still listed"
    publisher.publish_all()
    await ended
    assert reports.unpublished_jobs() == set()


async def test_a_forgotten_job_is_not_listed() -> None:
    publisher = HeldPublisher()
    reports = NodeReports("n1", publisher)  # type: ignore[arg-type]
    await reports.worker_started("j2", 0, 4242, 0, at=1.0, cause=None)
    reports.forget("j2")
    assert reports.unpublished_jobs() == set()
