"""The cluster's gauges, computed from a service's folded view at the moment Prometheus scrapes.

Why: a gauge set where a service acts (`gpus_free.dec()` on a placement) drifts from the
truth at the first missed path (a fence, a lost node, a rebuild), and then the dashboard and
`corral nodes` disagree for good. Computed from the view at scrape time, a gauge is the fold of
the log as the service holds it: always consistent with the log, nothing to keep in step, and the
same figures as the commands (`corral.summary` computes both). A scrape costs a pass over the
nodes and the active jobs, every 15 s or so.

Which service reports what: each family has one owner, so that a sum over the scraped targets
counts it once (placement: GPUs, nodes, jobs, heartbeats; quota: queues, pending reasons and
waits past max_wait).
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.core import GaugeMetricFamily

from corral.contracts.lifecycle import LifecycleCode
from corral.projection import ClusterView, JobState
from corral.summary import queue_rows

#: The states a GPU is counted in by `corral_gpus`, one per GPU (first that holds): `lost` on a lost
#: node; `releasing`: its gang was released and its processes are not confirmed gone (the fence), no
#: job is placed on it; `allocated` to a placed gang (on a draining node too: it runs on);
#: `unhealthy`: not allocated, found unhealthy by its agent (NVML); `gpu_drained`: not allocated,
#: drained by `corral gpu drain`; `draining`: not allocated, on a node drained by `corral drain`
#: (no new work); else `free`. `corral nodes` counts a draining node's unallocated GPUs as free:
#: there free = free + draining.
GPU_STATES = ("free", "allocated", "releasing", "draining", "lost", "unhealthy", "gpu_drained")
#: Nodes by state (`corral_nodes`), as `corral nodes` shows them.
NODE_STATES = ("ready", "draining", "lost")
#: A waiting job that has no reason recorded yet (just admitted).
NO_REASON = "NONE"
#: The reason of a held job (`corral hold`): it waits for `corral release`, not for GPUs, so it is
#: not in `corral_queue_pending_jobs` (what the starvation alert reads) nor in the fair share.
HELD = LifecycleCode.HELD.value


def gpu_families(view: ClusterView) -> list[GaugeMetricFamily]:
    """GPUs by node, model and state; the allocation ratio; nodes by state."""
    gpus = GaugeMetricFamily("corral_gpus", "GPUs by node, model and state (free, allocated, releasing: its "
                             "gang released, until its processes are gone, unhealthy: unallocated and found "
                             "unhealthy through NVML, gpu_drained: unallocated and drained by corral gpu drain, "
                             "draining: unallocated on a node drained by corral drain, lost: on a lost node).",
                             labels=["node", "model", "state"])
    unhealthy = GaugeMetricFamily("corral_gpu_unhealthy", "1 for each GPU its node's agent finds unhealthy through "
                                  "NVML (code: XID, ECC_DOUBLE_BIT, GPU_LOST), held or not.",
                                  labels=["node", "gpu", "code"])
    releasing = view.releasing_gpus()
    for node in sorted(view.nodes.values(), key=lambda n: n.name):
        held = releasing.get(node.name, {})
        counts: dict[str, list[int]] = {}  # model -> GPUs per state, in GPU_STATES order
        for gpu in node.inventory.gpus:
            state = ("lost" if node.lost else "releasing" if gpu.index in held
                     else "allocated" if gpu.index in node.allocations else "unhealthy" if gpu.index in node.unhealthy
                     else "gpu_drained" if gpu.index in node.drained_gpus else "draining" if node.draining
                     else "free")
            counts.setdefault(gpu.model or "", [0] * len(GPU_STATES))[GPU_STATES.index(state)] += 1
        for model, per_state in sorted(counts.items()):
            for state_name, n in zip(GPU_STATES, per_state, strict=True):
                gpus.add_metric([node.name, model, state_name], n)
        for index, problem in sorted(node.unhealthy.items()):
            unhealthy.add_metric([node.name, str(index), problem.code], 1)
    capacity = view.capacity()
    used = sum(len(n.allocations) for n in view.nodes.values() if not n.lost)
    ratio = GaugeMetricFamily("corral_gpu_allocation_ratio", "GPUs allocated (releasing ones included) over "
                              "the GPUs of nodes that are not lost.")
    ratio.add_metric([], used / capacity if capacity else 0.0)
    nodes = GaugeMetricFamily("corral_nodes", "Nodes by state (ready, draining: no new work, lost).",
                              labels=["state"])
    node_states = [_node_state(n.lost, n.draining) for n in view.nodes.values()]
    for state in NODE_STATES:
        nodes.add_metric([state], node_states.count(state))
    return [gpus, unhealthy, ratio, nodes]


def _node_state(lost: bool, draining: bool) -> str:
    """A node's state as `corral nodes` shows it."""
    return "lost" if lost else "draining" if draining else "ready"


def job_families(view: ClusterView) -> list[GaugeMetricFamily]:
    """Jobs not ended, by queue and state (ended ones are counted by `corral_jobs_ended_total`)."""
    jobs = GaugeMetricFamily("corral_jobs", "Jobs not ended, by queue and state.", labels=["queue", "state"])
    counts: dict[tuple[str, str], int] = {}
    for j in view.active.values():
        if not j.state.terminal:
            counts[(j.queue, j.state.value)] = counts.get((j.queue, j.state.value), 0) + 1
    for (queue, state), n in sorted(counts.items()):
        jobs.add_metric([queue, state], n)
    return [jobs]


def heartbeat_families(view: ClusterView, heartbeats: Mapping[str, float], now: float,
                       since: float) -> list[GaugeMetricFamily]:
    """Seconds since each known node's last heartbeat (since `since`, this process's start, for a
    node not heard yet: what placement counts toward losing it)."""
    age = GaugeMetricFamily("corral_node_heartbeat_age_seconds", "Seconds since the node's last heartbeat "
                            "reached placement.", labels=["node"])
    for name in sorted(view.nodes):
        age.add_metric([name], max(0.0, now - heartbeats.get(name, since)))
    return [age]


def queue_families(view: ClusterView) -> list[GaugeMetricFamily]:
    """Each queue's guarantee, ceiling, weight, usage, reservation, borrowing, fair share and waiting
    jobs (the rows of `corral queues`), and waiting jobs by queue and reason."""
    specs = {
        "guaranteed": ("corral_queue_guaranteed_gpus", "GPUs guaranteed to the queue (its subtree)."),
        "max": ("corral_queue_max_gpus", "The queue's ceiling in GPUs (only queues that set max_gpus)."),
        "weight": ("corral_queue_weight", "The queue's weight in sharing the surplus."),
        "in_use": ("corral_queue_used_gpus", "GPUs allocated to the queue's placed gangs (its subtree)."),
        "reserved": ("corral_queue_reserved_gpus", "Quota reserved by the queue's jobs, waiting ones included."),
        "borrowed": ("corral_queue_borrowed_gpus", "Quota reserved above the queue's guarantee."),
        "lendable": ("corral_queue_lendable_gpus", "Unused guarantee the queue may lend."),
        "pending": ("corral_queue_pending_jobs", "Jobs of the queue waiting for quota or GPUs."),
        "fair_share": ("corral_queue_fair_share_gpus", "The queue's fair share of GPUs given what every queue "
                       "wants now (corral.core.fairshare)."),
    }
    families = {key: GaugeMetricFamily(name, help_, labels=["queue"]) for key, (name, help_) in specs.items()}
    for row in queue_rows(view):
        for key, family in families.items():
            if row[key] is not None:
                family.add_metric([row["queue"]], float(row[key]))
    pending = GaugeMetricFamily("corral_pending_jobs", "Jobs waiting, by queue and the code of their last "
                                "reason; held jobs (corral hold) under reason HELD.", labels=["queue", "reason"])
    counts: dict[tuple[str, str], int] = {}
    for j in view.active.values():
        if j.state is JobState.HELD:
            counts[(j.queue, HELD)] = counts.get((j.queue, HELD), 0) + 1
        elif j.state is JobState.PENDING:
            waiting = (j.queue, j.reason.code if j.reason is not None else NO_REASON)
            counts[waiting] = counts.get(waiting, 0) + 1
    for (queue, reason), n in sorted(counts.items()):
        pending.add_metric([queue, reason], n)
    return [*families.values(), pending, wait_exceeded_family(view)]


def wait_exceeded_family(view: ClusterView) -> GaugeMetricFamily:
    """Jobs waiting past their queue's max_wait, escalated (a WaitExceeded in their current wait),
    by the job's queue; every configured queue has a sample (0 when none), so that an alert on it
    also sees the queue recover."""
    family = GaugeMetricFamily("corral_jobs_wait_exceeded", "Jobs waiting longer than their queue's max_wait "
                               "(a WaitExceeded recorded for their current wait; `corral jobs --stuck`).",
                               labels=["queue"])
    counts = dict.fromkeys(view.queues, 0)
    for wait in view.waits():
        if wait.escalated:
            counts[wait.queue] = counts.get(wait.queue, 0) + 1
    for queue, n in sorted(counts.items()):
        family.add_metric([queue], n)
    return family
