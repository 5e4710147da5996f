"""What the cluster looks like, in rows: the figures of `corral nodes` and `corral queues`.

Why: the services' `/metrics` (corral.telemetry) must report the very numbers the commands
print (GPUs free and in use per node, each queue's usage, reservation and pending jobs), or an
operator comparing a dashboard with `corral queues` sees two truths. So both compute them here,
from the folded log, once: the commands render these rows (`corral.cli.present` re-exports them),
the metrics read the same rows at scrape time.
"""

from __future__ import annotations

import re
from typing import Any

from corral.core.fairshare import fair_shares
from corral.core.quota import QueueTree
from corral.projection import ClusterView, JobState


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders node-2 before node-10 (digit runs compare as numbers)."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part)


def node_rows(view: ClusterView) -> list[dict[str, Any]]:
    """One row per node. `releasing`: GPUs of released gangs whose processes are not confirmed gone
    yet (still allocated, marked `~` in the map: no job is placed on them until they are).
    `unhealthy` (its agent's word through NVML) and `drained_gpus` (an admin's): GPUs out of
    service, never free; in the map `X` (unhealthy) or `D` (drained), or a holder's job with `!`."""
    rows = []
    releasing = view.releasing_gpus()
    for n in sorted(view.nodes.values(), key=lambda n: natural_key(n.name)):
        domains = n.inventory.nvlink_domains
        held = releasing.get(n.name, {})
        out = n.out_of_service
        gpu_map = []
        for d in domains:
            cells = []
            for g in d:
                holder = n.allocations.get(g)
                if not holder:
                    cells.append(("X" if g in n.unhealthy else "D") if g in out else ".")
                else:
                    cells.append(holder[-5:] + "~" if g in held else holder[-5:] + "!" if g in out else holder[-6:])
            gpu_map.append(cells)
        rows.append({
            "node": n.name,
            "state": "lost" if n.lost else "draining" if n.draining else "pressure" if n.conditions else "ready",
            # why it takes no new work, as its agent measured it (clears by itself)
            "conditions": [{"type": c.type, "message": c.message} for c in n.conditions],
            "rack": n.inventory.rack, "zone": n.inventory.zone,
            "address": n.address, "rendezvous_ports": list(n.rendezvous_ports) if n.rendezvous_ports else None,
            "model": n.inventory.gpus[0].model if n.inventory.gpus else "", "gpus": n.gpu_count,
            "used": len(n.allocations),
            "free": n.gpu_count - len(n.allocations) - len(out - n.allocations.keys()) if not n.lost else 0,
            "unhealthy": {str(g): {"code": p.code, "message": p.message, "xid": p.xid}
                          for g, p in sorted(n.unhealthy.items())},
            "drained_gpus": {str(g): {"user": d.user, "message": d.message} for g, d in sorted(n.drained_gpus.items())},
            "nvlink_domains": [list(d) for d in domains],
            "allocations": {str(g): job for g, job in sorted(n.allocations.items())},
            "releasing": {str(g): job for g, job in sorted(held.items())},
            "map": " | ".join(" ".join(cells) for cells in gpu_map),
        })
    return rows


#: Above this many nodes `corral nodes` and `corral top` show one row per rack by default (a
#: thousand node rows answer nothing at a glance, and render for seconds): filters show nodes.
SUMMARY_ABOVE = 64
_STATES = ("ready", "draining", "pressure", "lost")


def rack_rows(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per rack of `node_rows`: its nodes by state and its GPUs (free, in use, releasing)."""
    racks: dict[str, dict[str, Any]] = {}
    for n in nodes:
        r = racks.setdefault(n["rack"], {"rack": n["rack"], "zone": n["zone"], "nodes": 0, **dict.fromkeys(_STATES, 0),
                                         "gpus": 0, "used": 0, "free": 0, "releasing": 0, "models": []})
        r["nodes"] += 1
        r[n["state"]] += 1
        if n["state"] != "lost":
            r["gpus"] += n["gpus"]
            r["used"] += n["used"]
        r["free"] += n["free"]
        r["releasing"] += len(n["releasing"])
        if n["model"] and n["model"] not in r["models"]:
            r["models"].append(n["model"])
    return [racks[k] for k in sorted(racks, key=natural_key)]


def allocated_gpus(view: ClusterView) -> dict[str, int]:
    """GPUs each leaf queue has allocated to placed gangs (GangReserved and not yet released).

    Not `ClusterView.queue_usage`: that is the quota reserved, which also counts jobs still
    pending for a place (82 "in use" on a 60-GPU cluster when it was shown as use).
    """
    allocated: dict[str, int] = {}
    for j in view.active.values():
        if j.holding:
            allocated[j.queue] = allocated.get(j.queue, 0) + sum(len(r.gpus) for r in j.ranks)
    return allocated


def queue_demand(view: ClusterView) -> dict[str, int]:
    """GPUs each leaf queue wants now: allocated to its placed gangs plus asked by its waiting jobs."""
    return _per_queue(view)[3]


def _per_queue(view: ClusterView) -> tuple[dict[str, int], dict[str, int], dict[str, int], dict[str, int]]:
    """(quota reserved, GPUs allocated, jobs waiting, GPUs wanted) per leaf queue, in one pass over
    the active jobs (a scrape of the metrics runs this on the service's event loop)."""
    reserved: dict[str, int] = {}
    allocated: dict[str, int] = {}
    pending: dict[str, int] = {}
    demand: dict[str, int] = {}
    for j in view.active.values():
        queue = j.queue
        if j.quota_gpus:
            reserved[queue] = reserved.get(queue, 0) + j.quota_gpus
        if j.holding:
            gpus = sum(len(r.gpus) for r in j.ranks)
            allocated[queue] = allocated.get(queue, 0) + gpus
            demand[queue] = demand.get(queue, 0) + gpus
        elif j.state is JobState.PENDING:
            pending[queue] = pending.get(queue, 0) + 1
            demand[queue] = demand.get(queue, 0) + j.gpus
    return reserved, allocated, pending, demand


def queue_rows(view: ClusterView) -> list[dict[str, Any]]:
    """Per queue: GPUs in use (allocated to placed gangs) apart from quota reserved (pending
    jobs' reservations included); borrowed and lendable are quota figures; `fair_share` is what
    the queue would hold if the cluster were split by the tree's rules among the queues that want
    GPUs now (`corral.core.fairshare`)."""
    usage, allocated, pending, demand = _per_queue(view)
    capacity = view.capacity()
    shares = fair_shares(QueueTree(view.core_queues(), capacity), demand) if view.queues else {}
    names = sorted(view.queues, key=lambda n: (n.split("/"), n))
    rows = []
    for name in names:
        q = view.queues[name]
        reserved = sum(v for k, v in usage.items() if k == name or k.startswith(name + "/"))
        in_use = sum(v for k, v in allocated.items() if k == name or k.startswith(name + "/"))
        borrowed = max(0, reserved - q.guaranteed_gpus)
        lent = max(0, q.guaranteed_gpus - reserved) if reserved < q.guaranteed_gpus else 0
        rows.append({
            "queue": name, "guaranteed": q.guaranteed_gpus, "max": q.max_gpus, "weight": q.weight,
            "in_use": in_use, "reserved": reserved, "borrowed": borrowed,
            "lendable": min(lent, q.lend_limit if q.lend_limit is not None else lent),
            "pending": sum(v for k, v in pending.items() if k == name or k.startswith(name + "/")),
            "share": round(in_use / capacity, 3) if capacity else 0.0,
            "fair_share": round(shares.get(name, 0.0), 2),
        })
    return rows
