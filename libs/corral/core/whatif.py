"""What-if states: a snapshot after some events that would unblock a job, and what the core does then.

Why: a "would unblock" hint worked out beside the core (running jobs released in order of expected
end until the job alone fits) ignores every other waiting job and the queue tree: it names a job
whose GPUs the next job in fair-share order then takes, one of two jobs that must end, jobs in
racks the gang can never use. The answer must be the core's own: apply the events to the snapshot
and rerun the cycle.

An event is a value: a running job ends (`JobEnds`), a lost node comes back (`NodeBack`), GPUs out
of service (unhealthy, drained) are back in it (`GpusBack`), a queue's ceiling or guarantee is
raised (`QuotaRaised`). `apply_events` gives the what-if snapshot;
`rerun` gives the cycle's actions on it (the same `schedule` the services and the simulator run).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from corral.core.cycle import schedule
from corral.core.decisions import Decision, Place, Preempt
from corral.core.model import Cluster, NodeState, QueueConfig, RunningJob, SchedulerConfig, Snapshot
from corral.core.shortcuts import ClassMemo


@dataclass(frozen=True, slots=True)
class JobEnds:
    """Running job `job_id` (of `queue`) ends; `end` is when it is expected to (None: no estimate)."""

    job_id: str
    queue: str
    end: float | None
    frees: tuple[tuple[str, int], ...]  # (node, GPUs) it holds


@dataclass(frozen=True, slots=True)
class NodeBack:
    """A lost or draining node is ready again."""

    node: str
    gpus: int


@dataclass(frozen=True, slots=True)
class GpusBack:
    """GPUs `gpus` of `node`, out of service (unhealthy or drained), are in service again."""

    node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class QuotaRaised:
    """Queue `queue` gets `guaranteed_gpus` and `max_gpus` (None: unchanged, no ceiling)."""

    queue: str
    guaranteed_gpus: int
    max_gpus: int | None


WhatIf = JobEnds | NodeBack | GpusBack | QuotaRaised


def job_ends(r: RunningJob) -> JobEnds:
    return JobEnds(r.job.id, r.job.queue, r.expected_end(),
                   tuple((n, len(g)) for n, g in r.placement.gpus_by_node().items()))


def apply_events(snapshot: Snapshot, events: Iterable[WhatIf]) -> Snapshot:
    """The snapshot after `events` (pure: `snapshot` is not changed)."""
    events = tuple(events)
    ended = {e.job_id for e in events if isinstance(e, JobEnds)}
    back = {e.node for e in events if isinstance(e, NodeBack)}
    raised = {e.queue: e for e in events if isinstance(e, QuotaRaised)}
    running = snapshot.running if not ended else tuple(r for r in snapshot.running if r.job.id not in ended)
    cluster = snapshot.cluster if not back else _nodes_back(snapshot.cluster, back)
    in_service = [e for e in events if isinstance(e, GpusBack)]
    if in_service:
        cluster = _gpus_back(cluster, in_service)
    queues = snapshot.queues if not raised else _raised(snapshot.queues, raised)
    return Snapshot(snapshot.now, cluster, queues, snapshot.pending, running)


def _nodes_back(cluster: Cluster, back: set[str]) -> Cluster:
    return Cluster(tuple(dataclasses.replace(n, state=NodeState.READY) if n.name in back else n
                         for n in cluster.nodes))


def _gpus_back(cluster: Cluster, back: list[GpusBack]) -> Cluster:
    gpus: dict[str, set[int]] = {}
    for e in back:
        gpus.setdefault(e.node, set()).update(e.gpus)
    return Cluster(tuple(dataclasses.replace(n, out_of_service=n.out_of_service - gpus[n.name]) if n.name in gpus
                         else n for n in cluster.nodes))


def _raised(queues: Sequence[QueueConfig], raised: dict[str, QuotaRaised]) -> tuple[QueueConfig, ...]:
    out = []
    for q in queues:
        e = raised.get(q.name)
        out.append(q if e is None else dataclasses.replace(q, guaranteed_gpus=e.guaranteed_gpus, max_gpus=e.max_gpus))
    return tuple(out)


class Rerun:
    """The cycle's actions on what-if states of one snapshot, counted (the search has a budget).

    One `ClassMemo` serves every rerun: the pending jobs are the same objects in all of them."""

    def __init__(self, snapshot: Snapshot, config: SchedulerConfig) -> None:
        self.snapshot, self.config = snapshot, config
        self.memo = ClassMemo()
        self.count = 0

    def actions(self, events: Iterable[WhatIf] = ()) -> list[Decision]:
        self.count += 1
        return schedule(apply_events(self.snapshot, events), self.config, explain=False, memo=self.memo)

    def places(self, job_id: str, events: Iterable[WhatIf] = ()) -> bool:
        """Whether the cycle places `job_id` once `events` happened: a Place (it starts now) or a
        Preempt (it has its placement once the victims, asked to checkpoint, have stopped)."""
        return placed(self.actions(events), job_id) is not None


def placed(actions: Sequence[Decision], job_id: str) -> Place | Preempt | None:
    for d in actions:
        if d.job_id == job_id:
            return d if isinstance(d, Place | Preempt) else None
    return None
