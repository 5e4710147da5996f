"""How a simulation is shown: a table for people and a JSON document for programs.

The JSON document holds only simulated facts (no wall-clock figures), so the same seed gives the
same bytes; engine timings appear in the people's table and in the benchmarks only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.sim.metrics import Summary

if TYPE_CHECKING:
    from corral.sim.api import SimResult

JSON_VERSION = 1


def result_document(result: SimResult) -> dict[str, Any]:
    """The `--json` document: run description, `summary` and the exact `jobs` schedule."""
    return {
        "version": JSON_VERSION,
        "policy": result.policy,
        "seed": result.seed,
        "workload": {
            "source": result.workload.source,
            "jobs": len(result.workload.jobs),
            "notes": list(result.workload.notes),
        },
        "cluster": {
            "nodes": len(result.cluster.nodes),
            "gpus": result.cluster.total_gpus,
            "racks": len(result.cluster.racks()),
            "description": result.cluster_description,
        },
        "queues": [
            {
                "name": q.name,
                "guaranteed_gpus": q.guaranteed_gpus,
                "max_gpus": q.max_gpus,
                "lend_limit": q.lend_limit,
                "weight": q.weight,
            }
            for q in result.queues
        ],
        "notes": list(result.notes),
        "summary": result.summary.to_json(),
        "jobs": [r.to_json() for r in result.records],
    }


def write_json(result: SimResult, path: str | Path) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(result_document(result), separators=(",", ":")) + "\n")
    return target


def write_comparison_json(
    results: Sequence[SimResult], path: str | Path, *, verdict: Sequence[dict[str, Any]] | None = None
) -> Path:
    """`corral sim compare --json`: one document per policy under `runs`, and the verdict table's
    rows (`versus.verdict_rows`) under `verdict` when given."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"version": JSON_VERSION, "runs": [result_document(r) for r in results]}
    if verdict is not None:
        doc["verdict"] = list(verdict)
    target.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    return target


def duration(seconds: float) -> str:
    """Seconds in the largest unit that keeps them readable: 42s, 7.5m, 3.2h, 4.1d."""
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


_ROWS: tuple[tuple[str, str], ...] = (
    ("jobs", "jobs (finished / never started)"),
    ("avg_duration", "avg job duration"),
    ("avg_jct", "avg JCT"),
    ("p50_jct", "p50 JCT"),
    ("p95_jct", "p95 JCT"),
    ("p99_jct", "p99 JCT"),
    ("avg_wait", "avg wait"),
    ("p99_wait", "p99 wait"),
    ("makespan", "makespan"),
    ("gpu_utilisation", "GPU utilisation"),
    ("tight_placement_share", "multi-GPU jobs at tightest topology"),
    ("preemptions", "preemptions (jobs)"),
    ("gpu_seconds_lost_to_preemption", "GPU-hours lost to preemption"),
    ("jain_fairness", "Jain's fairness across queues"),
)


def _cell(summary: Summary, key: str) -> str:
    if key == "jobs":
        return f"{summary.jobs} ({summary.finished} / {summary.never_started})"
    if key == "preemptions":
        return f"{summary.preemptions} ({summary.preempted_jobs})"
    if key == "gpu_seconds_lost_to_preemption":
        return f"{summary.gpu_seconds_lost_to_preemption / 3600:.0f}"
    if key in ("gpu_utilisation", "tight_placement_share"):
        return f"{getattr(summary, key) * 100:.1f}%"
    if key == "jain_fairness":
        return f"{summary.jain_fairness:.3f}"
    return duration(float(getattr(summary, key)))


def render_comparison(results: Sequence[SimResult]) -> str:
    """Policies side by side, one column each, plus the notes every result must carry."""
    if not results:
        return "no results"
    first = results[0]
    header = ["", *(r.policy for r in results)]
    rows = [header] + [[label, *(_cell(r.summary, key) for r in results)] for key, label in _ROWS]
    rows.append(["sim wall time", *(f"{r.stats.wall_seconds:.1f}s" for r in results)])
    rows.append(["simulated jobs / wall s", *(f"{r.jobs_per_wall_second:,.0f}" for r in results)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        f"workload {first.workload.source} ({len(first.workload.jobs)} jobs) on {first.cluster_description} "
        f"({first.cluster.total_gpus} GPUs), seed {first.seed}",
    ]
    for n, row in enumerate(rows):
        lines.append(
            "  ".join(cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row))
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    notes = [*first.workload.notes, *first.notes]
    lines.extend(f"note: {note}" for note in notes)
    return "\n".join(lines)


def render_result(result: SimResult) -> str:
    """One policy: the summary table, where it left GPUs idle and the per-queue shares."""
    from corral.sim.idle import CATEGORIES, idle_breakdown, utilisation_bound

    idle = idle_breakdown(result.records, result.cluster, result.queues)
    split = ", ".join(f"{c.replace('_', ' ')} {idle.share(c) * 100:.1f}%" for c in CATEGORIES)
    bound = utilisation_bound(result.records, result.cluster.total_gpus)
    lines = [render_comparison([result]), f"idle GPU time (share of capacity): {split}",
             f"utilisation bound (any schedule of these jobs, no work lost): {bound * 100:.1f}%", "",
             _queue_table(result.summary)]
    waiting = len(result.final_reasons)
    if waiting:
        lines.append(f"{waiting} job(s) never finished; first reasons:")
        lines.extend(f"  {job}: {why}" for job, why in list(result.final_reasons.items())[:5])
    return "\n".join(lines)


def _queue_table(summary: Summary) -> str:
    rows = [["queue", "jobs", "GPU-hours", "share", "entitled", "alloc/fair", "avg JCT"]]
    for q in summary.queues:
        rows.append(
            [
                q.name,
                str(q.jobs),
                f"{q.gpu_seconds / 3600:.0f}",
                f"{q.share_of_gpu_time * 100:.1f}%",
                f"{q.entitlement * 100:.1f}%",
                "-" if q.mean_fair_share_ratio is None else f"{q.mean_fair_share_ratio:.2f}",
                "-" if q.avg_jct is None else duration(q.avg_jct),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row)) for row in rows
    )
