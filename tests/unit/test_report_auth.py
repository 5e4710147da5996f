"""Which node reports placement records (`services/placement/report_auth.py`)."""

from __future__ import annotations

from datetime import UTC, datetime

from corral.contracts import events as ev
from corral.contracts.envelope import Reason
from corral.projection import ClusterView, Fence, JobView
from corral.services.placement.report_auth import report_refused

NOW = datetime(2026, 12, 3, tzinfo=UTC)


def exited(node: str, rank: int, attempt: int) -> ev.WorkerExited:
    return ev.WorkerExited.new(stream="job-j", actor=f"node/{node}", job_id="j", rank=rank, node=node,
                               exit_code=0, attempt=attempt, reason=Reason(code="EXITED", message="exited"))


def requeued_view() -> ClusterView:
    """Job j: attempt 0 ran rank 0 on node-a, was released when node-a was lost and is fenced
    there; attempt 1 now runs rank 0 on node-b."""
    view = ClusterView()
    view.jobs["j"] = JobView(
        job_id="j", attempt=1, ranks=[ev.RankPlacement(rank=0, node="node-b", gpus=[0])],
        fences={0: Fence(attempt=0, ranks=[ev.RankPlacement(rank=0, node="node-a", gpus=[0])], placed_at=NOW,
                         released_at=NOW, open={"node-a": (0,)})})
    return view


def test_a_fenced_attempts_exit_is_recorded_from_the_node_that_held_it() -> None:
    # its exit is what frees node-a's GPUs; refusing it left them to the heartbeats alone
    assert report_refused(exited("node-a", 0, 0), "node-a", requeued_view()) is None


def test_the_current_attempt_is_reported_by_its_own_nodes_only() -> None:
    view = requeued_view()
    assert report_refused(exited("node-b", 0, 1), "node-b", view) is None
    assert report_refused(exited("node-a", 0, 1), "node-a", view) is not None  # node-a holds attempt 0 only
    assert report_refused(exited("node-b", 0, 0), "node-b", view) is not None  # node-b never held attempt 0
    assert report_refused(exited("node-a", 0, 0), "node-b", view) is not None  # reporting for another node


def test_a_node_reports_the_health_of_its_own_gpus_only_and_admins_drain_them() -> None:
    from corral.services.placement.report_auth import request_refused

    health = ev.GpuHealthChanged.new(stream="node-node-a", actor="node/node-a", node="node-a", unhealthy=[
        ev.GpuProblem(gpu=0, code="XID", message="XID 79", xid=79)])
    assert report_refused(health, "node-a", ClusterView()) is None
    assert report_refused(health, "node-b", ClusterView()) == "node node-b reported the GPU health of node node-a"
    drain = ev.GpuDrained.new(stream="node-node-a", actor="user/op", node="node-a", gpu=0, user="op")
    assert request_refused(drain, ("admin", "op"), ClusterView()) is None
    assert request_refused(drain, ("user", "op"), ClusterView()) is not None
    assert request_refused(drain, ("node", "node-a"), ClusterView()) == "GpuDrained is not a node report"
