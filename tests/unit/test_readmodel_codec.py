"""The read model's split, in memory: a view stored at any position (its active part in one blob,
each finished job on its own), decoded, given the finished jobs the tail is about, and folded
with the tail, says exactly what folding the whole log says (`corral.readmodel`)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.contracts.envelope import Event
from corral.projection import ClusterView
from corral.readmodel import codec
from tests.unit.readmodel_logs import varied_log

LOGS = {seed: varied_log(24, seed) for seed in range(4)}


def folded(events: list[Event]) -> ClusterView:
    view = ClusterView()
    for position, event in enumerate(events, 1):
        view.apply(event, None, position)
    return view


@settings(max_examples=60, deadline=None)
@given(seed=st.sampled_from(sorted(LOGS)), data=st.data())
def test_stored_view_and_tail_fold_as_the_whole_log(seed: int, data: st.DataObject) -> None:
    log = LOGS[seed]
    split = data.draw(st.integers(0, len(log)))
    before = folded(log[:split])
    hot = codec.encode_hot(before)
    rows = {j: codec.encode_job(v) for j, v in before.jobs.items() if j not in before.active}

    view = codec.decode_hot(hot)
    tail = log[split:]
    for touched in {j for e in tail for j in codec.touched_jobs(e)} - view.jobs.keys():
        if touched in rows:
            view.jobs[touched] = codec.decode_job(rows[touched])
    for position, event in enumerate(tail, split + 1):
        view.apply(event, None, position)

    whole = folded(log)
    assert view.active.keys() == whole.active.keys()
    for job_id, job in view.jobs.items():
        assert job == whole.jobs[job_id], job_id
    for job_id in whole.jobs.keys() - view.jobs.keys():  # never touched after the split: its row says it
        assert codec.decode_job(rows[job_id]) == whole.jobs[job_id], job_id
    assert view.nodes == whole.nodes and view.queues == whole.queues and view.ports == whole.ports
    assert view.position == whole.position == len(log)


def test_the_schema_names_the_folding_code() -> None:
    assert len(codec.SCHEMA) == 32 and codec._schema() == codec.SCHEMA
