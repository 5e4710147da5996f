"""Which node reports placement records: only a node's own, and only about gangs it holds.

Why: NATS permissions let a node-agent identity publish only on `<ns>.inbox.node.<its node>.>`
(see `corral.bus.auth`), but the report's body is still written by that agent: node-1 could publish,
on its own subject, a WorkerExited naming node-0, or a CheckpointDone for a job running elsewhere
(pointing `CORRAL_RESUME_FROM` at /etc/shadow). A report counts only when the subject's node is the
report's node and that node holds a rank of the job's current gang (or of the report's attempt,
while that released attempt is fenced). Pure and I/O-free.
"""

from __future__ import annotations

from corral.contracts import events as ev
from corral.contracts.envelope import Event
from corral.projection import ClusterView, JobView


def request_refused(event: Event, principal: tuple[str, str] | None, view: ClusterView,
                    ended: JobView | None = None) -> str | None:
    """Why `event`, received on a subject naming `principal` (kind, name; `Subjects.principal_of`),
    must be ignored; None: record it. A node's subject carries its reports (`report_refused`), an
    admin's a drain or an undrain (of a node or a GPU); a user's nothing placement takes. `ended`:
    the job a report names, read from the log when the view has forgotten it."""
    if principal is None or principal[0] == "node":
        return report_refused(event, principal[1] if principal else None, view, ended)
    kind, name = principal
    if kind == "admin" and isinstance(event, ev.NodeDrained | ev.NodeUndrained | ev.GpuDrained | ev.GpuUndrained):
        return None
    return f"{event.type} is not a request placement takes from {kind} {name}"


def report_refused(event: Event, sender: str | None, view: ClusterView, ended: JobView | None = None) -> str | None:
    """Why `event`, received on a subject naming node `sender`, must be ignored; None: record it.

    `sender` None: a bare `<ns>.inbox.<Type>` subject, which only a superuser may publish to."""
    if sender is None:
        return None
    if isinstance(event, ev.NodeRegistered):
        return None if event.node == sender else f"node {sender} registered as {event.node}"
    if isinstance(event, ev.NodeConditionsChanged):
        return None if event.node == sender else f"node {sender} reported conditions of node {event.node}"
    if isinstance(event, ev.GpuHealthChanged):
        return None if event.node == sender else f"node {sender} reported the GPU health of node {event.node}"
    if isinstance(event, ev.WorkerStarted | ev.WorkerExited):
        if event.node != sender:
            return f"node {sender} reported for node {event.node}"
    elif not isinstance(event, ev.CheckpointDone):
        return f"{event.type} is not a node report"
    job = view.jobs.get(event.job_id) or ended
    if job is None:
        return None  # an unknown job: placement records nothing for it anyway
    # The attempt's own ranks: the current gang's, or a released attempt's still fenced (its ranks
    # are stopping after a requeue, and their exits are what frees the GPUs).
    fence = job.fences.get(event.attempt)
    ranks = fence.ranks if fence is not None and event.attempt != job.attempt else job.ranks
    nodes = {rank.node for rank in ranks}
    if sender not in nodes:
        where = ", ".join(sorted(nodes)) or "no node"
        return f"node {sender} holds no rank of job {event.job_id} (its gang is on {where})"
    rank = getattr(event, "rank", None)
    if rank is not None and not any(r.node == sender and r.rank == rank for r in ranks):
        return f"node {sender} does not hold rank {rank} of job {event.job_id}"
    return None
