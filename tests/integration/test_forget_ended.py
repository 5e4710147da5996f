"""Admission and placement forget ended jobs and still answer about them, from the log.

On real NATS and Postgres, the decision services in one event loop (tests/integration/
test_services_flow.py's `system`): a job ends and both forget it; then
- a resubmission of its (user, submission id) under another job id is a duplicate: nothing is
  recorded for it, and the submission id still names the first job;
- a node's late report of one of its ranks is recorded on its stream, dated within the attempt;
  the same report from a node that held no rank of it is refused.
"""

from __future__ import annotations

import asyncio

from corral.contracts import events as ev
from corral.contracts.envelope import job_stream
from corral.contracts.queues import validate_queues
from corral.contracts.registry import encode
from corral.contracts.subjects import Subjects
from corral.projection import JobState
from tests.integration.test_services_flow import Running, register_nodes, report, spec, system  # noqa: F401


async def test_an_ended_job_is_answered_from_the_log_after_admission_and_placement_forget_it(
        system: Running) -> None:  # noqa: F811
    c = system.client
    await c.apply_queues(validate_queues({"queues": [{"name": "team-a", "guaranteed_gpus": 16}]}))
    await register_nodes(c, "2x8:H100", system.beats)
    await c.wait_for(lambda v: len(v.nodes) == 2 and "team-a" in v.queues, 15)
    first = await c.submit(spec(gpus_per_replica=8, submission_id="sub-1"), user="ann")  # type: ignore[arg-type]
    view = await c.wait_for(lambda v: first in v.jobs and v.jobs[first].state is JobState.STARTING, 15)
    (rank,) = view.jobs[first].ranks
    await report(c, first, view)
    view = await c.wait_for(lambda v: v.jobs[first].state is JobState.RUNNING, 15)
    await report(c, first, view, exit_code=0)
    await c.wait_for(lambda v: v.jobs[first].state is JobState.COMPLETED and v.free_gpus() == 16
                     and not v.jobs[first].quota_gpus, 15)
    await asyncio.sleep(0.5)  # every service has folded the end: the job is forgotten

    # a resubmission of the ended job's submission id, under another job id and past JetStream's
    # duplicate window (another msg id): admission's duplicate
    resent = c.submission(spec(gpus_per_replica=8, submission_id="sub-1"), job_id="j-again", user="ann")  # type: ignore[arg-type]
    await c.publish_request(resent, msg_id="past-the-duplicate-window")
    again = resent.job_id
    later = await c.submit(spec(gpus_per_replica=8, submission_id="sub-2"), user="ann")  # type: ignore[arg-type]
    await c.wait_for(lambda v: later in v.jobs and v.jobs[later].state is not JobState.SUBMITTED, 15)
    assert again == "j-again" and await c.job_events(again) == []
    assert await c.store.job_of_submission("ann", "sub-1") == first

    # a late report of its rank, from its node: recorded; from another node: refused
    other = next(n for n in view.nodes if n != rank.node)
    before = len(await c.job_events(first))
    for node in (other, rank.node):  # on each node's own subject, as its agent publishes
        late_exit = ev.WorkerExited.new(
            stream=job_stream(first), actor=f"node-agent/{node}", correlation_id=first, job_id=first, rank=0,
            node=node, exit_code=0, attempt=0, reason=ev.Reason(code="COMPLETED", message="exit 0 (late)"))
        await c.bus.publish(Subjects(c.bus.namespace).node_report(node, "WorkerExited"), encode(late_exit),
                            late_exit.event_id, {})
    for _ in range(100):
        trail = [e for _, e in await c.job_events(first)]
        if len(trail) > before:
            break
        await asyncio.sleep(0.1)
    late = trail[before:]
    assert [(type(e), e.node) for e in late] == [(ev.WorkerExited, rank.node)], late  # type: ignore[attr-defined]
    placed = next(e for e in trail if isinstance(e, ev.GangReserved)).occurred_at
    assert placed <= late[0].occurred_at
