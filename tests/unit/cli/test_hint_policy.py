"""`corral why` reruns the decisions under the cluster's policy (the log's PolicyInForce), not
corral's: on a fair-las cluster a fresh job goes before a job of its queue that already ran for
hours, so what it waits for is the running job's end, not the other waiting job."""

from __future__ import annotations

from datetime import timedelta

import pytest

from corral.cli.present import unblock_hint
from corral.contracts import events as ev
from corral.contracts.envelope import POLICY_STREAM, Event, Reason, job_stream, node_stream
from corral.projection import ClusterView
from corral.readmodel.codec import decode_base, decode_hot, encode_base, encode_hot
from tests.unit.cli.test_unblock_hint import T0, cluster, job_event, submit

HOUR = 3600.0
ALL = list(range(8))


def at(job_id: str, cls: type[Event], seconds: float, **payload: object) -> Event:
    return cls.new(stream=job_stream(job_id), actor="t", correlation_id=job_id, job_id=job_id,
                   now=T0 + timedelta(seconds=seconds), **payload)


def placed(view: ClusterView, job_id: str, seconds: float) -> None:
    view.apply(at(job_id, ev.GangReserved, seconds, ranks=[ev.RankPlacement(rank=0, node="node-0", gpus=ALL)],
                  world_size=1, master_addr="127.0.0.1", master_port=29500))
    view.apply(at(job_id, ev.JobRunning, seconds))


def in_force(policy: str) -> ev.PolicyInForce:
    return ev.PolicyInForce.new(stream=POLICY_STREAM, actor="quota", correlation_id="policy", policy=policy, now=T0)


def waiting_behind_a_job_that_ran(policy: str | None) -> ClusterView:
    """One 8-GPU node: `old` ran 3 h and was requeued, `r` runs (4 h estimated), `p` just came."""
    view = cluster("1x8:H100", [])
    if policy is not None:
        view.apply(in_force(policy))
    submit(view, "old", "q", 1, 8)
    placed(view, "old", 0)
    stop = Reason(code="PREEMPTED", message="m")
    view.apply(at("old", ev.GangReleased, 3 * HOUR, reason=stop))
    view.apply(ev.GpusReleased.new(stream=node_stream("node-0"), actor="t", correlation_id="old", node="node-0",
                                   job_id="old", gpus=ALL, now=T0 + timedelta(seconds=3 * HOUR)))
    view.apply(at("old", ev.JobRequeued, 3 * HOUR, reason=stop, attempt=1))
    submit(view, "r", "q", 1, 8, estimated_runtime_seconds=4 * HOUR)
    placed(view, "r", 3 * HOUR)
    submit(view, "p", "q", 1, 8)
    view.apply(job_event("p", ev.PlacementPending, reason=Reason(code="GANG_DOES_NOT_FIT", message="m")))
    return view


@pytest.mark.parametrize("policy", [None, "corral"])
def test_under_corral_the_job_that_came_first_goes_first(policy: str | None) -> None:
    view = waiting_behind_a_job_that_ran(policy)
    assert view.policy == "corral"
    hint = unblock_hint(view, view.jobs["p"], T0.timestamp() + 4 * HOUR) or ""
    assert "job old" in hint and "it starts after them" in hint, hint


def test_under_fair_las_the_fresh_job_goes_first_so_it_waits_for_the_running_job() -> None:
    view = waiting_behind_a_job_that_ran("fair-las")
    assert view.policy == "fair-las"
    hint = unblock_hint(view, view.jobs["p"], T0.timestamp() + 4 * HOUR) or ""
    assert "node-0 frees 8 when job r ends" in hint and "job old" not in hint, hint


def test_the_last_policy_recorded_is_in_force_and_the_read_model_keeps_it() -> None:
    view = ClusterView()
    for policy in ("fair-las", "las", "fair-las"):
        view.apply(in_force(policy))
    assert view.policy == "fair-las"
    assert decode_base(encode_base(view))[0].policy == "fair-las"
    assert decode_hot(encode_hot(view)).policy == "fair-las"


def test_a_policy_this_code_does_not_know_reads_as_the_default() -> None:
    view = ClusterView()
    view.apply(in_force("next-year"))
    assert view.policy == "next-year"
    assert view.scheduler_config() == ClusterView().scheduler_config()
