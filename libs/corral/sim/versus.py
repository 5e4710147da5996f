"""`corral sim compare`'s verdict table: each policy against a chosen baseline, on the figures a
policy is judged by (avg and p95 JCT normalised to the baseline's, utilisation, Jain's index
across queues, GPU time lost to preemption as a share of the GPU time held, and the average wait
of the largest gang class), plus where each leaves GPUs idle (`idle.idle_breakdown`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from corral.sim.idle import CATEGORIES, gang_waits, idle_breakdown, utilisation_bound

if TYPE_CHECKING:
    from corral.sim.api import SimResult


def _ratio(x: float, base: float) -> float | None:
    return x / base if base else None


def verdict_rows(results: Sequence[SimResult], baseline: str | None = None) -> list[dict[str, Any]]:
    """One row per result; `baseline` names the policy the JCTs are divided by (default: the first)."""
    base = next((r for r in results if r.policy == baseline), results[0])
    largest = max((c for r in results for c in gang_waits(r.records)), default=1)
    rows = []
    for r in results:
        s = r.summary
        held = s.gpu_utilisation * s.capacity_gpus * s.makespan
        waits = gang_waits(r.records)
        idle = idle_breakdown(r.records, r.cluster, r.queues)
        rows.append({
            "policy": r.policy,
            "baseline": base.policy,
            "avg_jct_seconds": s.avg_jct,
            "avg_jct_vs_baseline": _ratio(s.avg_jct, base.summary.avg_jct),
            "p95_jct_seconds": s.p95_jct,
            "p95_jct_vs_baseline": _ratio(s.p95_jct, base.summary.p95_jct),
            "utilisation": s.gpu_utilisation,
            "jain_fairness": s.jain_fairness,
            "preemption_loss_share": s.gpu_seconds_lost_to_preemption / held if held else 0.0,
            "largest_gang_class_gpus": largest,
            "largest_gang_class_avg_wait_seconds": waits.get(largest, (0, None))[1],
            "gang_class_avg_wait_seconds": {str(c): w for c, (_, w) in waits.items()},
            "idle_share": idle.to_json(),
            "utilisation_bound": utilisation_bound(r.records, r.cluster.total_gpus),
        })
    return rows


def render_verdict(rows: Sequence[dict[str, Any]]) -> str:
    """The table of `verdict_rows`, for people."""
    from corral.sim.output import duration

    def ratio(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    largest = rows[0]["largest_gang_class_gpus"] if rows else 1
    header = ["policy", "avg JCT", "p95 JCT", "utilisation", "Jain (queues)", "preemption loss",
              f"{largest}-GPU class wait"]
    table = [header]
    for row in rows:
        wait = row["largest_gang_class_avg_wait_seconds"]
        table.append([
            row["policy"], ratio(row["avg_jct_vs_baseline"]), ratio(row["p95_jct_vs_baseline"]),
            f"{row['utilisation'] * 100:.1f}%", f"{row['jain_fairness']:.3f}",
            f"{row['preemption_loss_share'] * 100:.2f}%", "-" if wait is None else duration(wait),
        ])
    idle = [["idle GPU time", *(c.replace("_", " ") for c in CATEGORIES)]]
    for row in rows:
        idle.append([row["policy"], *(f"{row['idle_share'][c] * 100:.1f}%" for c in CATEGORIES)])
    title = f"normalised to {rows[0]['baseline']} (avg and p95 JCT); preemption loss: share of GPU time held"
    if not rows:
        return "no results"
    bound = f"utilisation bound (any schedule of these jobs, no work lost): {rows[0]['utilisation_bound'] * 100:.1f}%"
    return "\n".join([title, *_grid(table), "", *_grid(idle), bound])


def _grid(table: list[list[str]]) -> list[str]:
    widths = [max(len(t[i]) for t in table) for i in range(len(table[0]))]
    return ["  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(t)) for t in table]
