"""Stand-ins the services' unit tests share: a clock they move by hand, and a placement whose
appends fold as a real append folds them (no NATS, no Postgres)."""

from __future__ import annotations

from typing import Any

from corral.contracts import events as ev
from corral.contracts.cluster import GpuDevice
from corral.contracts.envelope import node_stream
from corral.contracts.jobspec import validate_job_spec
from corral.contracts.queues import QueueSpec
from corral.services.placement.service import Placement
from tests.unit.services.job_events import job_event


class Clock:
    """A clock (wall or monotonic) that stands still until a test moves `now`."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FoldingAppends:
    """A service's appends fold as a real append does (or lose their race while `lose`):
    `appended` has every event appended, in order, and `appended_streams` each append's streams;
    the view is built by `fold`. Mixed in before the service's class."""

    view: Any
    folded: Any
    _fold_appended: Any

    def __init__(self, clock: Clock, service: Any) -> None:
        stand_in: Any = object()
        service.__init__(self, stand_in, stand_in, clock=clock, monotonic=clock)
        self.appended: list[Any] = []
        self.appended_streams: list[list[str]] = []
        self.lose = False

    async def append(self, batches: Any, **_: Any) -> bool:
        batches = {stream: events for stream, events in batches.items() if events}
        if not batches:
            return True
        if self.lose:
            return False
        self.appended.extend(e for events in batches.values() for e in events)
        self.appended_streams.append(sorted(batches))
        self._fold_appended(batches, {})
        return True

    def fold(self, *events: Any) -> None:
        for e in events:
            self.view.apply(e)
            self.folded(e)


class FoldingPlacement(FoldingAppends, Placement):
    """Placement whose appends fold as a real append's (`FoldingAppends`)."""

    def __init__(self, clock: Clock) -> None:
        FoldingAppends.__init__(self, clock, Placement)

    def reasons_of(self, job_id: str) -> list[str]:
        """The codes of the PlacementPendings appended for `job_id`, in order."""
        return [e.reason.code for e in self.appended if isinstance(e, ev.PlacementPending) and e.job_id == job_id]


def waiting(job_id: str) -> list[Any]:
    """A job of 8 GPUs of queue q holding quota, waiting for GPUs."""
    spec = validate_job_spec({"name": job_id, "queue": "q", "gpus_per_replica": 8, "runtime": "sim",
                              "duration_seconds": 86400})
    return [job_event(job_id, ev.JobSubmitted, spec=spec),
            job_event(job_id, ev.JobAdmitted, queue="q", priority=0, replicas=1, gpus_per_replica=8),
            job_event(job_id, ev.QuotaReserved, queue="q", gpus=8, borrowed=0)]


def one_node(placement: FoldingPlacement, guaranteed_gpus: int) -> None:
    """Queue q with `guaranteed_gpus` and node n1 of 8 GPUs, folded into `placement`."""
    placement.fold(
        ev.QueueConfigured.new(stream="queue-q", actor="test",
                               queue=QueueSpec(name="q", guaranteed_gpus=guaranteed_gpus)),
        ev.NodeRegistered.new(stream=node_stream("n1"), actor="agent", node="n1",
                              gpus=[GpuDevice(index=i, model="H100") for i in range(8)],
                              nvlink_domains=[list(range(8))], rack="r", zone="z"))
