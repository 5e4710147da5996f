"""corral.core: the pure, deterministic scheduling core (standard library only, no I/O, no clock).

A cycle takes a `Snapshot` (time, cluster, queues, pending and running jobs) and returns one
`Decision` per pending job, in a deterministic order: `Place` (the whole gang, rank by rank),
`Preempt` (victims to checkpoint so that the job fits afterwards) or `Pending` (with a `Reason`).

Entry point:
    schedule(snapshot, config=SchedulerConfig(), *, explain=True, memo=None) -> list[Decision]
        explain=False: only the Place and Preempt decisions (exactly those of the full cycle),
        without explaining the jobs that stay pending; the simulator and the preemption service.
        memo: a `ClassMemo` the caller keeps between calls (the core keeps no state of its own),
        so that PendingJob objects kept from call to call are classed once.
    SchedulerState(cluster, queues, config): the same cycle for an owner that reports every change
        (add_pending / remove_pending / add_running / remove_running / replace_running /
        set_cluster) instead of building a snapshot; state.cycle(now, explain=False) equals
        schedule(state.snapshot(now), config, explain=False). The simulator's engine.

Phases, callable on their own because the live services split the work:
    order_pending(snapshot, config=SchedulerConfig(), *, tree=None, usage=None) -> list[PendingJob]
        quota service: fair share across the queue tree (or fifo / priority / LAS order).
    quota_check(snapshot, job, usage=None, *, tree=None, quotas=True) -> Reason | None
        quota service: None when the queue tree admits `job` now (guarantee, borrowing, lend
        limits, max_gpus); else QUEUE_UNKNOWN / MAX_GPUS_EXCEEDED / QUOTA_EXCEEDED. `usage` is a
        `QueueUsage` (QueueUsage.of(QueueTree.of(snapshot), snapshot.running) by default).
    reserve_quota(snapshot, config=SchedulerConfig(), *, reserved=(), held=()) -> list[Reserve | Pending]
        quota service (corral.core.reservation): order + quota_check for each waiting job, and
        no reservation for a job the same round's preemption would take back at once.
    find_placement(cluster, free, job) -> Placement | Reason
        placement service: `free` is a `FreeGpus` index, built with
        FreeGpus.from_running(cluster, running) or FreeGpus.from_mapping(cluster, {node: [gpu]}).
        The index is not modified; commit with free.take(...) or a `Statement`.
    select_victims(snapshot, pending_job, config=SchedulerConfig(), *, free=None)
            -> tuple[str, ...] | Reason
        preemption service: the cheapest victims after which the job provably fits.
    static_feasibility(cluster, job, idle=None) -> Reason | None
        admission: TOPOLOGY_UNSATISFIABLE / NO_MATCHING_GPU when the request can never fit.
    hints.unblock(snapshot, job_id, config=SchedulerConfig()) -> Hint
        `corral why`: the smallest set of events (jobs ending, nodes back, quota raised) after
        which the cycle, rerun on the what-if state (`whatif.apply_events`), places the job.
    escalation.to_escalate(waits, limits, now) -> list[Overdue]
        quota service: the waits past their queue's `max_wait` not escalated yet (WaitExceeded,
        once per wait); `escalation.stuck` is `corral jobs --stuck`'s list.

The live services as three configurations of one pipeline (`steps`, `pipeline`):
    step_config(Step.QUOTA | Step.PLACEMENT | Step.PREEMPTION, config) -> SchedulerConfig
    reserve_quota (quota), placement_step(snapshot, config, *, holding=None, explain=True, memo=None),
    preemption_step(snapshot, config, *, memo=None) -> list[Preempt]: what each service decides.
    run_round(snapshot, config, *, holding=(), held=()) -> Round: the three in a row, as the
        services run them (the simulator's pipeline mode).

Where each rule lives: `cycle` (the steps of one job's decision, in order), `prepared` (a cycle's
input, from a snapshot; `state` keeps the same between cycles), `ledger` (free, releasing and
claimed GPUs), `preemption/` (eligibility: the victim rule; candidates; search; plan), `quota`,
`ordering`, `placement`, `backfill`, `reservation` (the quota step's round), `steps` and
`pipeline` (the services' split), `whatif` and `hints` (exact unblock hints), `escalation` (waits
past `max_wait`); `shortcuts` holds
the speed-ups (class answers, negative caches, early stop), `reasons` the wording of answers.

Policies (`SchedulerConfig.named`): "corral" fair share + EASY backfill + preemption + reclaim;
"fifo" strict submit order; "priority" priority then age with in-queue preemption; "backfill" FIFO
+ EASY backfill; "las" least attained service first, preemptive (Tiresias-style); "fair-las"
corral's fair share, backfill and reclaim across queues, and inside each queue attained-service
levels (`levels`) with preemption of a job of the queue at a higher level.
"""

from __future__ import annotations

import importlib
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.core.cycle import Cycle, schedule
    from corral.core.decisions import Decision, Pending, Place, Preempt, Reason, ReasonCode
    from corral.core.gpuset import FreeGpus, Statement
    from corral.core.model import (
        Cluster,
        Gpu,
        GpuRequest,
        Job,
        Node,
        NodeState,
        OrderPolicy,
        PendingJob,
        Placement,
        QueueConfig,
        RankPlacement,
        RunningJob,
        SchedulerConfig,
        Snapshot,
        Topology,
        TopologyLevel,
    )
    from corral.core.ordering import order_pending
    from corral.core.placement import find_placement, static_feasibility
    from corral.core.preemption import select_victims
    from corral.core.quota import QueueTree, QueueUsage, quota_check
    from corral.core.shortcuts import ClassMemo
    from corral.core.state import SchedulerState

# Lazily (PEP 562): a reader of the log (`corral jobs`, the projection) needs the model's types,
# not the cycle, backfill and preemption search that importing them all here would load. Each
# name is imported from its module on first use (and kept as the module's attribute, as an import
# would have: no state of the core's own); type checkers read the imports above.
_HOMES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cycle", ("Cycle", "schedule")),
    ("decisions", ("Decision", "Pending", "Place", "Preempt", "Reason", "ReasonCode")),
    ("gpuset", ("FreeGpus", "Statement")),
    ("model", ("Cluster", "Gpu", "GpuRequest", "Job", "Node", "NodeState", "OrderPolicy", "PendingJob", "Placement",
               "QueueConfig", "RankPlacement", "RunningJob", "SchedulerConfig", "Snapshot", "Topology",
               "TopologyLevel")),
    ("ordering", ("order_pending",)),
    ("placement", ("find_placement", "static_feasibility")),
    ("preemption", ("select_victims",)),
    ("quota", ("QueueTree", "QueueUsage", "quota_check")),
    ("shortcuts", ("ClassMemo",)),
    ("state", ("SchedulerState",)),
)
_HOME = MappingProxyType({name: module for module, names in _HOMES for name in names})

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"corral.core.{module}"), name)
    globals()[name] = value
    return value
