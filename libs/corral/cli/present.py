"""Rows for people and scripts, computed from the folded log (one function per listing).

Why separate from the commands: the table and the `--json` form of a listing come from the same
row dictionaries, so they can never disagree, and tests check the rows directly.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from corral import core
from corral.core.backfill import Release, reserve
from corral.core.gpuset import FreeGpus
from corral.core.placement import find_placement
from corral.projection import ClusterView, JobState, JobView


def age(at: datetime | None, now: datetime | None = None) -> str:
    if at is None:
        return ""
    seconds = int(((now or datetime.now(UTC)) - at).total_seconds())
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders node-2 before node-10 (digit runs compare as numbers)."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part)


def job_row(j: JobView, now: datetime | None = None) -> dict[str, Any]:
    return {
        "id": j.job_id,
        "name": j.spec.name if j.spec else "",
        "queue": j.queue,
        "user": j.user or "",
        "prio": j.priority,
        "state": j.state.value,
        "gpus": j.gpus,
        "nodes": ",".join(j.nodes) if j.holding else "",
        "age": age(j.submitted_at, now),
        "reason": "" if j.state in (JobState.RUNNING, JobState.COMPLETED) or j.reason is None
        else f"{j.reason.code}: {j.reason.message}",
        "attempt": j.attempt,
        "submitted_at": j.submitted_at.isoformat() if j.submitted_at else None,
    }


JOB_COLUMNS = ["ID", "NAME", "QUEUE", "PRIO", "STATE", "GPUS", "NODES", "AGE", "REASON"]


def job_detail(j: JobView) -> dict[str, Any]:
    row = job_row(j)
    row.update({
        "spec": None if j.spec is None else _spec_dict(j.spec),
        "ranks": [{"rank": r.rank, "node": r.node, "gpus": list(r.gpus)} for r in j.ranks],
        "quota_gpus": j.quota_gpus,
        "borrowed": j.borrowed,
        "checkpoint": j.checkpoint,
        "resume_from": j.resume_from,
        "restarts": j.restarts,
        "preempted_by": sorted(j.preempted_by),
        "running_since": j.running_since.isoformat() if j.running_since else None,
        "ended_at": j.ended_at.isoformat() if j.ended_at else None,
        "reason_code": j.reason.code if j.reason else None,
        "reason_message": j.reason.message if j.reason else None,
    })
    return row


def _spec_dict(spec: Any) -> dict[str, Any]:
    import msgspec

    built: dict[str, Any] = msgspec.to_builtins(spec)
    return built


def node_rows(view: ClusterView) -> list[dict[str, Any]]:
    """One row per node. `releasing`: GPUs of released gangs whose processes are not confirmed gone
    yet (still allocated, marked `~` in the map: no job is placed on them until they are)."""
    rows = []
    releasing = view.releasing_gpus()
    for n in sorted(view.nodes.values(), key=lambda n: natural_key(n.name)):
        domains = n.inventory.nvlink_domains
        held = releasing.get(n.name, {})
        gpu_map = []
        for d in domains:
            cells = []
            for g in d:
                holder = n.allocations.get(g)
                cells.append("." if not holder else holder[-5:] + "~" if g in held else holder[-6:])
            gpu_map.append(cells)
        rows.append({
            "node": n.name, "state": "lost" if n.lost else "ready", "rack": n.inventory.rack, "zone": n.inventory.zone,
            "address": n.address, "rendezvous_ports": list(n.rendezvous_ports) if n.rendezvous_ports else None,
            "model": n.inventory.gpus[0].model if n.inventory.gpus else "", "gpus": n.gpu_count,
            "used": len(n.allocations), "free": n.gpu_count - len(n.allocations) if not n.lost else 0,
            "nvlink_domains": [list(d) for d in domains],
            "allocations": {str(g): job for g, job in sorted(n.allocations.items())},
            "releasing": {str(g): job for g, job in sorted(held.items())},
            "map": " | ".join(" ".join(cells) for cells in gpu_map),
        })
    return rows


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


def queue_rows(view: ClusterView) -> list[dict[str, Any]]:
    """Per queue: GPUs in use (allocated to placed gangs) apart from quota reserved (pending
    jobs' reservations included); borrowed and lendable are quota figures."""
    usage = view.queue_usage()
    allocated = allocated_gpus(view)
    pending: dict[str, int] = {}
    for j in view.jobs.values():
        if j.state is JobState.PENDING:
            pending[j.queue] = pending.get(j.queue, 0) + 1
    capacity = view.capacity()
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
        })
    return rows


def unblock_hint(view: ClusterView, job: JobView, now: float) -> str | None:
    """What would let a pending job start: the running jobs whose end frees room for it.

    The what-if is the core's own backfill reservation (`core.backfill.reserve`: running jobs end
    in order of expected end until the job fits); the jobs named are those holding GPUs of the
    placement it would then get, with the nodes they free.
    """
    if job.state is not JobState.PENDING or job.spec is None:
        return None
    reason = job.reason.code if job.reason else ""
    snapshot = view.snapshot(now, pending=[job])
    target = job.core_job()
    running = sorted(snapshot.running, key=_end_key)
    if reason in ("QUOTA_EXCEEDED", "MAX_GPUS_EXCEEDED"):
        same = [r for r in running if r.job.queue == job.queue]
        if not same:
            return (f"raise the quota of {job.queue} (`corral apply`), or wait for other queues to give back "
                    "borrowed GPUs")
        first = same[0]
        hint = f"queue {job.queue} regains {first.job.total_gpus} GPUs when job {first.job.id} ends" + _eta(first, now)
        # The quota is one blocker; the GPUs must also be free. Name the other jobs that must end too.
        others = _must_end(snapshot.cluster, target, running, ended=first) or []
        if others:
            hint += "; then it still needs " + "; ".join(_frees(x, now) for x in others)
        return hint
    ending = _must_end(snapshot.cluster, target, running)
    if ending is None:
        return f"needs {target.shape}{_topology(target)}: not even an empty cluster of this shape fits it"
    if not ending:
        return "it fits now: it starts at the next scheduling cycle"
    return f"needs {target.shape}" + _topology(target) + "; " + "; ".join(_frees(x, now) for x in ending)


def _must_end(cluster: core.Cluster, job: core.Job, running: list[core.RunningJob],
              ended: core.RunningJob | None = None) -> list[core.RunningJob] | None:
    """The running jobs (besides `ended`) that must end before `job` fits, in `running`'s order;
    None if it fits no cluster of this shape. Asks the core's backfill reservation where the job
    would start and names the jobs holding GPUs of that placement."""
    rest = [r for r in running if r is not ended]
    fi = FreeGpus.from_running(cluster, rest)
    if isinstance(find_placement(cluster, fi, job), core.Placement):
        return []  # (`reserve` is asked only for a job that does not fit now)
    masks = {r.job.id: fi.masks_of(r.placement) for r in rest}
    releases = [Release(_end_key(r)[0], r.job.id, masks[r.job.id]) for r in rest]
    reservation = reserve(fi, job, releases, {})
    if reservation is None:
        return None
    wanted = dict(reservation.masks)
    return [r for r in rest if any(m & wanted.get(i, 0) for i, m in masks[r.job.id])]


def _frees(r: core.RunningJob, now: float) -> str:
    nodes = ", ".join(f"{n} frees {len(g)}" for n, g in r.placement.gpus_by_node().items())
    return f"{nodes} when job {r.job.id} ends{_eta(r, now)}"


def _end_key(r: core.RunningJob) -> tuple[float, float, str]:
    end = r.expected_end()
    return (end if end is not None else float("inf"), r.start_time, r.job.id)


def _eta(r: core.RunningJob, now: float) -> str:
    end = r.expected_end()
    return f" (in ~{max(0, int(end - now))}s)" if end is not None else ""


def _topology(job: core.Job) -> str:
    if job.topology.gang is not None:
        return f" inside one {job.topology.gang.value}" + (" domain" if job.topology.gang.value == "nvlink" else "")
    return ""
