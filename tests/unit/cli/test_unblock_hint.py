"""`corral why`'s "would unblock": which running jobs must end before a pending job fits.

The hint is the core's (`core.hints.unblock`): the cycle rerun on what-if states, naming the
smallest set of events (jobs ending, soonest expected end first) after which it places the job;
before, the CLI released running jobs until the job alone fitted (see test_exact_hints.py).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from corral.cli.present import unblock_hint
from corral.contracts import events as ev
from corral.contracts.cluster import parse_cluster_shorthand
from corral.contracts.envelope import Event, Reason, job_stream, node_stream, queue_stream
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.queues import validate_queues
from corral.projection import ClusterView

T0 = datetime(2026, 12, 1, tzinfo=UTC)
NOW = T0.timestamp() + 100


def job_event(job_id: str, cls: type[Event], **payload: Any) -> Event:
    return cls.new(stream=job_stream(job_id), actor="t", correlation_id=job_id, job_id=job_id, now=T0, **payload)


def submit(view: ClusterView, job_id: str, queue: str, replicas: int, gpus: int, **extra: Any) -> None:
    spec = validate_job_spec({"name": job_id, "queue": queue, "replicas": replicas, "gpus_per_replica": gpus,
                              "runtime": "sim", "duration_seconds": 600, **extra})
    view.apply(job_event(job_id, ev.JobSubmitted, spec=spec))
    view.apply(job_event(job_id, ev.JobAdmitted, queue=queue, priority=500, replicas=replicas,
                         gpus_per_replica=gpus))


def run(view: ClusterView, job_id: str, node: str, gpus: list[int], estimate: float | None) -> None:
    submit(view, job_id, "q", 1, len(gpus), **({"estimated_runtime_seconds": estimate} if estimate else {}))
    view.apply(job_event(job_id, ev.GangReserved, ranks=[ev.RankPlacement(rank=0, node=node, gpus=gpus)],
                         world_size=1, master_addr="127.0.0.1", master_port=29500))
    view.apply(job_event(job_id, ev.JobRunning))


def cluster(shape: str, running: list[tuple[str, str, list[int], float | None]], quota: bool = False) -> ClusterView:
    view = ClusterView()
    for inv in parse_cluster_shorthand(shape).inventories():
        view.apply(ev.NodeRegistered.new(stream=node_stream(inv.node), actor="agent", node=inv.node, gpus=inv.gpus,
                                         nvlink_domains=inv.nvlink_domains, rack=inv.rack, zone=inv.zone, now=T0))
    q_limits: dict[str, object] = {"guaranteed_gpus": 8, "max_gpus": 8} if quota else {"guaranteed_gpus": 16}
    queues = [{"name": "q", **q_limits}, {"name": "team-b", "guaranteed_gpus": 0, "max_gpus": 4}]
    for q in validate_queues({"queues": queues}).queues:
        view.apply(ev.QueueConfigured.new(stream=queue_stream(q.name), actor="t", queue=q, now=T0))
    for job_id, node, gpus, estimate in running:
        run(view, job_id, node, gpus, estimate)
    return view


def hint(view: ClusterView, replicas: int, gpus: int, code: str = "GANG_DOES_NOT_FIT", queue: str = "q") -> str:
    submit(view, "p", queue, replicas, gpus)
    view.apply(job_event("p", ev.PlacementPending, reason=Reason(code=code, message="m")))
    out = unblock_hint(view, view.jobs["p"], NOW)
    assert out is not None
    return out


HALF = [0, 1, 2, 3]
OTHER_HALF = [4, 5, 6, 7]
ALL = list(range(8))

CASES: list[tuple[str, str, list[tuple[str, str, list[int], float | None]], tuple[int, int], list[str], list[str]]] = [
    # (case, cluster, running (id, node, GPUs, estimate), pending shape, named in order, not named)
    ("it fits now", "2x8:H100", [("a", "node-0", ALL, 300)], (1, 8), ["fits now"], ["job a"]),
    ("the job ending soonest frees a whole node", "2x8:H100",
     [("late", "node-0", ALL, 900), ("soon", "node-1", ALL, 300)], (1, 8),
     ["node-1 frees 8 when job soon ends (in ~200s)"], ["job late"]),
    ("two halves of one node: both must end", "1x8:H100",
     [("b", "node-0", OTHER_HALF, 600), ("a", "node-0", HALF, 300)], (1, 8),
     ["job a ends", "job b ends"], []),
    ("a job that only frees GPUs the placement does not use is not named", "2x8:H100",
     [("x", "node-0", HALF, 100), ("y", "node-1", ALL, 200), ("z", "node-0", OTHER_HALF, 900)], (1, 8),
     ["node-1 frees 8 when job y ends"], ["job x", "job z"]),
    ("a gang across nodes: every holder ends", "2x8:H100",
     [("a", "node-0", ALL, 300), ("b", "node-1", ALL, None)], (2, 8),
     ["needs 2x8 GPUs", "job a ends (in ~200s)", "job b ends"], []),
    ("no cluster of this shape fits it", "1x8:H100", [("a", "node-0", ALL, 300)], (3, 8),
     ["not even an empty cluster"], ["job a"]),
]


@pytest.mark.parametrize(("shape", "running", "pending", "named", "not_named"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_hint_names_the_jobs_that_must_end(shape: str, running: list[tuple[str, str, list[int], float | None]],
                                               pending: tuple[int, int], named: list[str],
                                               not_named: list[str]) -> None:
    text = hint(cluster(shape, running), *pending)
    positions = [text.find(n) for n in named]
    assert all(p >= 0 for p in positions) and positions == sorted(positions), text
    assert not any(n in text for n in not_named), text


def test_a_quota_blocker_names_its_queues_jobs_that_give_the_quota_back() -> None:
    # queue q (max 8) runs 4 GPUs on each node; its 8-GPU job needs both back (a free node alone
    # is not enough): the jobs are named soonest first, with what each gives back
    view = cluster("2x8:H100", [("mine", "node-1", HALF, 300), ("other", "node-0", OTHER_HALF, 600)], quota=True)
    text = hint(view, 1, 8, code="MAX_GPUS_EXCEEDED")
    assert "when job mine ends (in ~200s); " in text and text.endswith("when job other ends (in ~500s)"), text
    assert "regains 4 GPUs" in text and "frees 4" in text, text


def test_a_quota_blocker_with_nothing_of_its_queue_running_says_to_raise_the_quota() -> None:
    view = cluster("1x8:H100", [])
    text = hint(view, 1, 8, code="MAX_GPUS_EXCEEDED", queue="team-b")
    assert "queue team-b set to guaranteed_gpus 0, max_gpus 8 (`corral apply`)" in text, text


def test_no_hint_for_a_job_that_is_not_pending() -> None:
    view = cluster("1x8:H100", [("a", "node-0", ALL, 300)])
    assert unblock_hint(view, view.jobs["a"], NOW) is None
