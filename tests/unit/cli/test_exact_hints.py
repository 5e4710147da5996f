"""The "would unblock" hints a guess beside the core gets wrong, each replayed on the folded log.

A guess ("release running jobs until the job alone fits") misleads a new user in each case; the
hint is the core's (`core.hints.unblock`: the cycle rerun on what-if states), and `corral why` only
presents it (`cli/present.py`).
- fair share: a job of queue B waits behind J of queue A; when J ends its GPU goes to the A job
  ahead of it, and B is under its guarantee: the answer says both;
- rack topology: the hint lists no node in another rack, which can never help;
- two blockers: the hint names both, not one after which the gang still waits;
- (lost work: tests/unit/core/test_exact_hints_core.py and the e2e smoke).
A held job is told "corral release J" and what it would then wait for.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from corral.cli.present import blocker_standing, release_hint, unblock_hint
from corral.contracts import events as ev
from corral.contracts.cluster import GpuDevice
from corral.contracts.envelope import Event, Reason, job_stream, node_stream, queue_stream
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.queues import validate_queues
from corral.projection import ClusterView, JobState

T0 = datetime(2026, 12, 1, tzinfo=UTC)
NOW = T0.timestamp() + 100


def job_event(job_id: str, cls: type[Event], at: datetime = T0, **payload: Any) -> Event:
    return cls.new(stream=job_stream(job_id), actor="t", correlation_id=job_id, job_id=job_id, now=at, **payload)


def world(nodes: list[tuple[str, int, str]], queues: list[dict[str, Any]]) -> ClusterView:
    """Nodes (name, GPUs, rack) and queues, folded from their events."""
    view = ClusterView()
    for name, gpus, rack in nodes:
        view.apply(ev.NodeRegistered.new(stream=node_stream(name), actor="agent", node=name, now=T0,
                                         gpus=[GpuDevice(index=i, model="H100", memory_gib=80) for i in range(gpus)],
                                         nvlink_domains=[list(range(gpus))], rack=rack, zone="zone-0"))
    for q in validate_queues({"queues": queues}).queues:
        view.apply(ev.QueueConfigured.new(stream=queue_stream(q.name), actor="t", queue=q, now=T0))
    return view


def submit(view: ClusterView, job_id: str, queue: str, replicas: int, gpus: int, at: float = 0, **extra: Any) -> None:
    when = datetime.fromtimestamp(T0.timestamp() + at, UTC)
    spec = validate_job_spec({"name": job_id, "queue": queue, "replicas": replicas, "gpus_per_replica": gpus,
                              "runtime": "sim", "duration_seconds": 600, **extra})
    view.apply(job_event(job_id, ev.JobSubmitted, when, spec=spec))
    view.apply(job_event(job_id, ev.JobAdmitted, when, queue=queue, priority=500, replicas=replicas,
                         gpus_per_replica=gpus))


def run(view: ClusterView, job_id: str, queue: str, ranks: list[tuple[str, int]], estimate: float,
        first_gpu: int = 0) -> None:
    submit(view, job_id, queue, len(ranks), ranks[0][1], estimated_runtime_seconds=estimate)
    placed = [ev.RankPlacement(rank=i, node=n, gpus=list(range(first_gpu, first_gpu + g)))
              for i, (n, g) in enumerate(ranks)]
    view.apply(job_event(job_id, ev.GangReserved, ranks=placed, world_size=len(placed),
                         master_addr="127.0.0.1", master_port=29500))
    view.apply(job_event(job_id, ev.JobRunning))


def waiting(view: ClusterView, job_id: str, queue: str, replicas: int, gpus: int, at: float, code: str,
            **extra: Any) -> str:
    submit(view, job_id, queue, replicas, gpus, at, **extra)
    view.apply(job_event(job_id, ev.PlacementPending, reason=Reason(code=code, message="0 free")))
    text = unblock_hint(view, view.jobs[job_id], NOW)
    assert text is not None
    return text


def test_fair_share_names_both_jobs_and_the_job_ahead_that_takes_the_first_gpu() -> None:
    """Queue team-a (1 of 4 guaranteed in use) is ahead of team-b (3 of 4) in fair share: the GPU
    job j frees goes to team-a's waiting job k; job p of team-b needs a second one (r0's)."""
    view = world([("node-0", 4, "rack-0")], [{"name": "team-a", "guaranteed_gpus": 4},
                                             {"name": "team-b", "guaranteed_gpus": 4}])
    run(view, "j", "team-a", [("node-0", 1)], 300, first_gpu=0)
    for i in range(3):
        run(view, f"r{i}", "team-b", [("node-0", 1)], 400 + 100 * i, first_gpu=1 + i)
    waiting(view, "k", "team-a", 1, 1, at=10, code="GANG_DOES_NOT_FIT")
    text = waiting(view, "p", "team-b", 1, 1, at=20, code="GANG_DOES_NOT_FIT")
    # before: "needs 1x1 GPUs; node-0 frees 1 when job j ends (in ~200s)" (k then took that GPU)
    assert "job j ends" in text and "job r0 ends" in text, text
    assert "then job k, ahead of it in queue team-a, takes 1 of the freed GPUs" in text, text
    assert "job r1" not in text and "job r2" not in text, text
    standing = blocker_standing(view, view.jobs["p"], NOW)
    assert "queue team-b uses 3 of 4 guaranteed GPUs (under its guarantee)" in standing, standing
    assert "queue team-a uses 1 of 4" in standing and "nothing to reclaim" in standing, standing


RACKS = [("node-0", 4, "rack-0"), ("node-1", 4, "rack-0"), ("node-2", 4, "rack-1"), ("node-3", 4, "rack-1")]


def test_a_rack_gang_hint_names_no_node_of_another_rack() -> None:
    """Job s spans node-1 (rack-0) and node-2 (rack-1); the 2x4 rack gang can use rack-1 once s
    and u end. Before, the hint said "node-1 frees 4, node-2 frees 4 when job s ends": node-1 is in
    the rack the gang does not use."""
    view = world(RACKS, [{"name": "q", "guaranteed_gpus": 16}])
    run(view, "s", "q", [("node-1", 4), ("node-2", 4)], 100)
    run(view, "t", "q", [("node-0", 4)], 900)
    run(view, "u", "q", [("node-3", 4)], 800)
    text = waiting(view, "g", "q", 2, 4, at=10, code="GANG_DOES_NOT_FIT", topology={"gang": "rack"})
    assert "node-2 frees 4 when job s ends" in text and "node-3 frees 4 when job u ends" in text, text
    assert "node-0" not in text and "node-1" not in text and "job t" not in text, text


def test_both_blockers_are_named_the_quota_and_the_gpus() -> None:
    """Queue q (max 8) runs x (rack-0) and y (rack-1); the 2x4 rack gang of q needs all 8 of its
    quota back and a free rack. Before: "queue q regains 4 GPUs when job x ends; then it still
    needs node-1 frees 4 when job z ends": with x gone q still used 4 of 8, so the gang waited."""
    view = world(RACKS, [{"name": "q", "guaranteed_gpus": 8, "max_gpus": 8}, {"name": "o", "guaranteed_gpus": 8}])
    run(view, "x", "q", [("node-0", 4)], 100)
    run(view, "z", "o", [("node-1", 4)], 200)
    run(view, "y", "q", [("node-2", 4)], 900)
    text = waiting(view, "g", "q", 2, 4, at=10, code="MAX_GPUS_EXCEEDED", topology={"gang": "rack"})
    assert "queue q regains 4 GPUs when job x ends" in text, text
    assert "node-2 frees 4 when job y ends" in text, text
    assert "job z" not in text, text


def test_a_lost_node_coming_back_is_an_event_of_the_hint() -> None:
    """Only node-1 (lost) has 8 GPUs: no job ending helps, its coming back does."""
    view = world([("node-0", 4, "rack-0"), ("node-1", 8, "rack-0")], [{"name": "q", "guaranteed_gpus": 12}])
    run(view, "t", "q", [("node-0", 4)], 900)
    view.apply(ev.NodeLost.new(stream=node_stream("node-1"), actor="placement", node="node-1", now=T0,
                               reason=Reason(code="NODE_LOST", message="no heartbeat")))
    text = waiting(view, "g", "q", 1, 8, at=10, code="GANG_DOES_NOT_FIT")
    assert text == "needs 1x8 GPUs; node node-1 comes back (8 GPUs)", text


def test_a_held_job_is_told_what_it_would_wait_for_once_released() -> None:
    """Before, `corral why` of a held job said only "corral release h", as if that started it."""
    view = world([("node-0", 4, "rack-0"), ("node-1", 4, "rack-0")], [{"name": "q", "guaranteed_gpus": 8}])
    run(view, "a", "q", [("node-0", 4)], 300)
    run(view, "b", "q", [("node-1", 4)], 900)
    submit(view, "h", "q", 1, 4, at=10)
    view.apply(job_event("h", ev.JobHeld, user="ann", message="dataset broken"))
    held = view.jobs["h"]
    assert held.state is JobState.HELD and unblock_hint(view, held, NOW) is None
    assert release_hint(view, held, NOW) == "needs 1x4 GPUs; node-0 frees 4 when job a ends (in ~200s)"
    assert release_hint(view, view.jobs["a"], NOW) is None  # not held
