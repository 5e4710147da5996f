"""`corral sim --from-log`: what-if on the cluster's own history.

Why: "what would last week have looked like with these quotas?" The event log holds every
submission (the exact specs), the cluster (NodeRegistered) and the queues (QueueConfigured); this
turns them into the simulator's ordinary inputs — a JSONL workload, a cluster file and a queues
file — so the replay runs through exactly the same path as any trace. A job's duration is what it
really ran (first JobRunning to its end), else its spec's duration or estimate.

Layers: the simulator sits below the CLI (import-linter forbids `corral.sim` importing
`corral.cli`), so this module only turns events into files; the CLI reads them from the log
(`corral.client.Client.events`, the one log reader both use) and hands them in.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec

from corral.contracts import events as ev
from corral.contracts.envelope import Event


def workload_from_events(events: Sequence[Event], since: datetime | None = None,
                         ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """(JSONL job lines, cluster file, queues file) from the log's events, in log order; with
    `since`, only the jobs submitted since then (the cluster and queues are the whole log's)."""
    submitted: dict[str, ev.JobSubmitted] = {}
    started: dict[str, float] = {}
    ran: dict[str, float] = {}
    nodes: dict[str, dict[str, Any]] = {}
    queues: dict[str, dict[str, Any]] = {}
    rejected: set[str] = set()
    for e in events:
        if isinstance(e, ev.JobSubmitted):
            submitted.setdefault(e.job_id, e)
        elif isinstance(e, ev.JobRejected):
            rejected.add(e.job_id)
        elif isinstance(e, ev.JobRunning):
            started.setdefault(e.job_id, e.occurred_at.timestamp())
        elif isinstance(e, ev.JobCompleted | ev.JobFailed | ev.JobCancelled) and e.job_id in started:
            ran.setdefault(e.job_id, e.occurred_at.timestamp() - started[e.job_id])
        elif isinstance(e, ev.NodeRegistered):
            model = e.gpus[0].model if e.gpus else "GPU"
            nodes[e.node] = {
                "name": e.node,
                "model": model or "GPU",
                "gpus": [msgspec.to_builtins(g) for g in e.gpus],
                "nvlink_domains": e.nvlink_domains,
                "rack": e.rack,
                "zone": e.zone,
            }
        elif isinstance(e, ev.QueueConfigured):
            queues[e.queue.name] = msgspec.to_builtins(e.queue)
    jobs = [s for j, s in submitted.items() if j not in rejected and (since is None or s.occurred_at >= since)]
    t0 = min((s.occurred_at.timestamp() for s in jobs), default=0.0)
    lines = []
    for s in jobs:
        spec = msgspec.to_builtins(s.spec)
        duration = ran.get(s.job_id) or s.spec.duration_seconds or s.spec.estimated_runtime_seconds or 60.0
        spec.update(
            {
                "name": s.job_id,
                "runtime": "sim",
                "duration_seconds": round(float(duration), 3),
                "submit_at": round(s.occurred_at.timestamp() - t0, 3),
            }
        )
        if spec.get("user") is None and s.user:
            spec["user"] = s.user  # who submitted it, as the log says (per-user limits read it)
        spec.pop("command", None)
        spec.pop("submission_id", None)
        lines.append(spec)
    return lines, {"nodes": list(nodes.values())}, {"queues": list(queues.values())}


@dataclass(frozen=True)
class ExportedInputs:
    """The simulator's inputs exported from the log: a trace spec and, when known, cluster and queues files."""

    trace: str
    cluster: str | None
    queues: str | None
    #: the scheduling policy the cluster decided by last (its last PolicyInForce; none: corral)
    policy: str = "corral"


def export_inputs(events: Sequence[Event], out_dir: Path | None = None, since: datetime | None = None,
                  ) -> ExportedInputs:
    """Write the log's submissions, nodes and queues as simulator input files (for `--from-log`).

    The caller reads the log (the CLI through its connection options, see `corral.cli.sim`): the
    simulator is below the CLI and never reaches a cluster itself.
    """
    lines, cluster, queues = workload_from_events(events, since)
    if not lines:
        raise SystemExit("error: the event log holds no admitted submissions to replay")
    out = out_dir or Path(tempfile.mkdtemp(prefix="corral-from-log-"))
    workload = out / "workload.jsonl"
    workload.write_text("".join(json.dumps(line) + "\n" for line in lines))
    (out / "cluster.json").write_text(json.dumps(cluster))
    queues_path = None
    if queues["queues"]:
        (out / "queues.json").write_text(json.dumps(queues))
        queues_path = str(out / "queues.json")
    policy = next((e.policy for e in reversed(events) if isinstance(e, ev.PolicyInForce)), "corral")
    return ExportedInputs(f"jsonl:{workload}", str(out / "cluster.json") if cluster["nodes"] else None, queues_path,
                          policy)
