"""The read model's split, in memory: a view stored at any position (nodes, queues and ports in one
blob, each job on its own), decoded, given the finished jobs the tail is about, and folded
with the tail, says exactly what folding the whole log says (`corral.readmodel`)."""

from __future__ import annotations

from collections.abc import Iterable

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


def fold_tail(view: ClusterView, rows: dict[str, bytes], jobs: Iterable[str], log: list[Event], split: int) -> None:
    """As a reader does: load the rows of `jobs` and of the jobs the tail (after `split`) is about,
    then fold the tail."""
    tail = log[split:]
    for wanted in (set(jobs) | {j for e in tail for j in codec.touched_jobs(e)}) & rows.keys():
        job = view.jobs[wanted] = codec.decode_job(rows[wanted])
        if job.active:
            view.active[wanted] = job
    for position, event in enumerate(tail, split + 1):
        view.apply(event, None, position)


@settings(max_examples=60, deadline=None)
@given(seed=st.sampled_from(sorted(LOGS)), data=st.data())
def test_stored_view_and_tail_fold_as_the_whole_log(seed: int, data: st.DataObject) -> None:
    log = LOGS[seed]
    split = data.draw(st.integers(0, len(log)))
    before = folded(log[:split])
    base = codec.encode_base(before)
    rows = {j: codec.encode_job(v) for j, v in before.jobs.items()}  # every job a row, active or over

    view, stored = codec.decode_base(base)
    assert set(stored.held) | {j for j, v in before.jobs.items() if not v.state.terminal} == before.active.keys()
    fold_tail(view, rows, before.active.keys(), log, split)

    whole = folded(log)
    assert view.active.keys() == whole.active.keys()
    for job_id, job in view.jobs.items():
        assert job == whole.jobs[job_id], job_id
    for job_id in whole.jobs.keys() - view.jobs.keys():  # never touched after the split: its row says it
        assert codec.decode_job(rows[job_id]) == whole.jobs[job_id], job_id
    assert view.nodes == whole.nodes and view.queues == whole.queues and view.ports == whole.ports
    assert view.position == whole.position == len(log)


@settings(max_examples=60, deadline=None)
@given(seed=st.sampled_from(sorted(LOGS)), data=st.data())
def test_a_view_of_the_nodes_needs_only_the_fenced_jobs_and_the_tails(seed: int, data: st.DataObject) -> None:
    """`read_nodes`: the stored nodes, the jobs stored with a fence and those the tail is about,
    folded with the tail, give each node and its releasing GPUs as the whole log does."""
    log = LOGS[seed]
    split = data.draw(st.integers(0, len(log)))
    before = folded(log[:split])
    rows = {j: codec.encode_job(v) for j, v in before.jobs.items()}
    view, stored = codec.decode_base(codec.encode_base(before))
    assert set(stored.fenced) == {j.job_id for j in before.fenced_jobs()}
    fold_tail(view, rows, stored.fenced, log, split)
    whole = folded(log)
    assert view.nodes == whole.nodes and view.releasing_gpus() == whole.releasing_gpus()


def test_the_varied_logs_hold_fences() -> None:
    """The logs above release gangs whose ranks are not gone yet at some position (a fence to read)."""
    assert any(folded(log[:split]).fenced_jobs() for log in LOGS.values() for split in range(len(log)))


def test_the_schema_names_the_folding_code() -> None:
    assert len(codec.SCHEMA) == 32 and codec._schema() == codec.SCHEMA


def test_the_gateway_blob_holds_the_active_jobs() -> None:
    view = folded(LOGS[0])
    back = codec.decode_hot(codec.encode_hot(view))
    assert back.active.keys() == view.active.keys() and back.nodes == view.nodes


def test_a_row_is_filtered_on_its_state_submission_queue_and_user() -> None:
    job = next(j for j in folded(LOGS[0]).jobs.values() if j.spec is not None)
    assert codec.job_columns(job) == (job.state.value, job.submitted_at, job.queue, job.user)
