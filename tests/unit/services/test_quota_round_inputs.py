"""What a quota round hands the core: who waits, which of them hold quota, and what is still held.

The problem: a round ran three list comprehensions over every active job on the event loop (plus a
fourth to ask whether any waiting job lacked quota), thousands of jobs each in Kueue's shape. It is
one pass now; this checks it against the comprehensions it replaced, on any mix of jobs. No NATS or
Postgres: the core's step is replaced by a recorder.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.contracts.jobspec import validate_job_spec
from corral.projection import JobState, JobView
from corral.services.quota import service as quota_module
from corral.services.quota.service import Quota

SPEC = validate_job_spec({"name": "j", "queue": "a", "replicas": 1, "gpus_per_replica": 1, "runtime": "sim",
                          "duration_seconds": 1})

jobs = st.lists(st.tuples(st.sampled_from(list(JobState)), st.booleans(), st.sampled_from([0, 0, 1, 8]),
                          st.booleans(), st.booleans()), max_size=30)


def as_before(active: list[JobView]) -> tuple[list[str], set[str], list[tuple[str, int]]] | None:
    """The round's inputs as the comprehensions computed them (None: no round)."""
    pending = [j for j in active if j.state is JobState.PENDING and j.spec is not None]
    if not any(not j.quota_gpus for j in pending):
        return None
    held = [(j.queue, j.quota_gpus) for j in active
            if j.quota_gpus and not j.holding and (j.state is not JobState.PENDING or j.quota_stale)]
    pending = [j for j in pending if not j.quota_stale]
    return [j.job_id for j in pending], {j.job_id for j in pending if j.quota_gpus}, held


@settings(max_examples=300, deadline=None)
@given(jobs)
def test_a_round_hands_the_core_what_the_comprehensions_did(made: list[tuple[Any, ...]]) -> None:
    stand_in: Any = object()
    quota = Quota(stand_in, stand_in)
    quota.view.queues = {"a": stand_in}
    for i, (state, has_spec, gpus, stale, holding) in enumerate(made):
        job = JobView(job_id=f"j{i:02d}")
        job.state, job.spec, job.quota_gpus, job.quota_stale, job.holding = (
            state, SPEC if has_spec else None, gpus, stale and gpus > 0, holding)
        quota.view.active[job.job_id] = job
    seen: list[tuple[list[str], set[str], list[tuple[str, int]]]] = []

    def snapshot(now: float, pending: list[JobView]) -> list[str]:
        return [j.job_id for j in pending]

    def reserve(snap: list[str], config: Any, *, reserved: set[str], held: list[tuple[str, int]]) -> list[Any]:
        seen.append((snap, set(reserved), list(held)))
        return []

    async def append(*_: Any, **__: Any) -> bool:
        return True

    quota.view.snapshot = snapshot
    quota.append = append
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quota_module, "reserve_quota", reserve)
        asyncio.run(quota._reserve())
    expected = as_before(list(quota.view.active.values()))
    assert seen == ([] if expected is None else [expected])
