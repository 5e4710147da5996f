"""`corral why` and `corral show` tell the truth about a waiting job in both phases of its wait for
GPUs: while placement holds its first reason back (`services.placement.first_reason`) they say quota
reserved it and when, and that placement has recorded no reason; once placement says why, that.

A real stack: one node of 8 GPUs taken by a long job, a second 8-GPU job waits; the grace is set
long (10 s) so the first phase is seen on a loaded machine too.
"""

from __future__ import annotations

from pathlib import Path

from corral.contracts import events as ev
from corral.projection import JobState
from tests.e2e.conftest import StackFactory, connect, with_queues
from tests.e2e.test_cli import as_json, corral, job_yaml, wait_state, write

GRACE = 10.0


async def test_why_and_show_of_a_waiting_job_before_and_after_placement_says_why(
        make_stack: StackFactory, tmp_path: Path) -> None:
    stack = make_stack(cluster="1x8:H100", env={"CORRAL_FIRST_REASON_GRACE_SECONDS": str(GRACE)})
    c = await connect(stack)
    try:
        await with_queues(c, [{"name": "q", "guaranteed_gpus": 16}], nodes=1)

        def submit(name: str) -> str:
            path = write(tmp_path, f"{name}.yaml", job_yaml(name, "q", 1, 8, 600))
            return str(as_json(corral(stack, "submit", path, "--json"))["id"])

        first = submit("first")
        await wait_state(c, first, JobState.RUNNING)
        second = submit("second")
        await c.wait_for(lambda v: second in v.jobs and v.jobs[second].quota_gpus > 0, 60)

        why = as_json(corral(stack, "why", second, "--json"))
        show = as_json(corral(stack, "show", second, "--json"))
        said = [s for s in why["trail"] if s["event"] == "PlacementPending"]
        assert not said, f"placement said a reason within its grace: {said}"
        reserved = next(s for s in why["trail"] if s["event"] == "QuotaReserved")
        assert why["state"] == "PENDING" and why["blocker"]["code"] == "QUOTA_RESERVED", why["blocker"]
        assert f"at {reserved['at'][:23]}" in why["blocker"]["message"], (reserved, why["blocker"])
        assert "placement has recorded no reason" in why["blocker"]["message"]
        assert (show["reason_code"], show["reason_message"]) == ("QUOTA_RESERVED", why["blocker"]["message"])

        await c.wait_for(lambda v: v.jobs[second].reason is not None, GRACE + 60)
        why = as_json(corral(stack, "why", second, "--json"))
        (pending,) = [(stored, e) for stored, e in await c.job_events(second) if isinstance(e, ev.PlacementPending)]
        _, event = pending
        assert event.actor == "placement"
        quota = next(e for _, e in await c.job_events(second) if isinstance(e, ev.QuotaReserved))
        assert (event.occurred_at - quota.occurred_at).total_seconds() >= GRACE - 0.5, "said after its grace"
        assert (why["blocker"]["code"], why["blocker"]["message"]) == (event.reason.code, event.reason.message)
        show = as_json(corral(stack, "show", second, "--json"))
        assert show["reason_code"] == event.reason.code
    finally:
        await c.close()
