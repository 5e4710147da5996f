"""One definition of a job's shape: placement's memo keys and admission's remembered verdicts read
the same fields, and every field of a Job is either shape or not, by decision."""

from __future__ import annotations

import dataclasses

from corral import core
from corral.core.shortcuts import NOT_SHAPE_FIELDS, SHAPE_FIELDS, shape, shaped


def test_every_field_of_a_job_is_shape_or_not_by_decision() -> None:
    fields = {f.name for f in dataclasses.fields(core.Job)}
    assert fields == set(SHAPE_FIELDS) | set(NOT_SHAPE_FIELDS), fields ^ (set(SHAPE_FIELDS) | set(NOT_SHAPE_FIELDS))
    assert not set(SHAPE_FIELDS) & set(NOT_SHAPE_FIELDS)


def test_shaped_keeps_the_shape_and_nothing_else() -> None:
    job = core.Job(id="j1", queue="team-a", replicas=2, gpus_per_replica=4, submit_time=17.0, priority=5,
                   gpu=core.GpuRequest(model="H100"), preemptible=False, checkpoint_grace_seconds=90,
                   min_runtime_seconds=60, estimated_runtime_seconds=3600.0, user="alice")
    reduced = shaped(job)
    assert shape(reduced) == shape(job) == tuple(getattr(job, f) for f in SHAPE_FIELDS)
    other = dataclasses.replace(job, **{f: getattr(core.Job(id="x", queue="y", replicas=1, gpus_per_replica=1,
                                                            submit_time=0.0), f)
                                       for f in NOT_SHAPE_FIELDS})
    assert shaped(other) == reduced  # what names, dates, ranks or times a job is not its shape
