"""PNG plots of one or more simulated schedules (matplotlib, Agg backend: no display needed).

- utilisation.png: allocated GPUs / capacity over time, one line per policy;
- jct_cdf.png: the CDF of job completion times per policy (log scale);
- queue_share_<policy>.png: each queue's share of allocated GPUs over time (stacked).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from corral.sim.records import JobRecord, records_from_json

if TYPE_CHECKING:
    from corral.sim.api import SimResult

BINS = 400


def _binned_allocation(
    records: Sequence[JobRecord], horizon: float, by_queue: bool
) -> tuple[list[float], dict[str, list[float]]]:
    """Average allocated GPUs per time bin (per queue when asked), exact by overlap length."""
    width = horizon / BINS if horizon > 0 else 1.0
    edges = [i * width for i in range(BINS)]
    series: dict[str, list[float]] = {}
    for r in records:
        key = r.queue if by_queue else "all"
        line = series.setdefault(key, [0.0] * BINS)
        for p in r.placements:
            first, last = int(p.start // width), min(int(p.end // width), BINS - 1)
            for b in range(first, last + 1):
                overlap = min(p.end, (b + 1) * width) - max(p.start, b * width)
                if overlap > 0:
                    line[b] += overlap * p.gpu_count / width
    return edges, series


@dataclass(frozen=True, slots=True)
class PlotRun:
    """What the plots need from one run, whether it comes from a SimResult or a --json document."""

    policy: str
    records: Sequence[JobRecord]
    capacity: int
    makespan: float


def write_plots(results: Sequence[SimResult], directory: str | Path) -> list[Path]:
    """Plots of results computed in this process."""
    runs = [PlotRun(r.policy, r.records, r.cluster.total_gpus, r.summary.makespan) for r in results]
    return write_run_plots(runs, directory)


def write_plots_from_json(paths: Sequence[str | Path], directory: str | Path) -> list[Path]:
    """Plots of runs saved with --json (one document per policy), e.g. by separate processes."""
    runs = []
    for path in paths:
        doc = json.loads(Path(path).read_text())
        runs.append(
            PlotRun(
                doc["policy"],
                records_from_json(doc["jobs"]),
                int(doc["cluster"]["gpus"]),
                float(doc["summary"]["makespan"]),
            )
        )
    return write_run_plots(runs, directory)


def write_run_plots(results: Sequence[PlotRun], directory: str | Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    horizon = max((r.makespan for r in results), default=0.0)
    days = 86400.0

    fig, ax = plt.subplots(figsize=(10, 4))
    for result in results:
        edges, series = _binned_allocation(result.records, horizon, by_queue=False)
        capacity = result.capacity or 1
        ax.plot(
            [e / days for e in edges],
            [v / capacity * 100 for v in series.get("all", [0.0] * BINS)],
            label=result.policy,
            linewidth=1,
        )
    ax.set_xlabel("days since first submission")
    ax.set_ylabel("GPUs allocated (% of capacity)")
    ax.set_title("GPU utilisation over time")
    ax.legend()
    fig.tight_layout()
    written.append(_save(fig, out / "utilisation.png"))
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 5))
    for result in results:
        jcts = sorted(r.end - r.submit for r in result.records if r.end is not None)
        if jcts:
            ax.plot(
                [max(j, 1.0) for j in jcts],
                [(i + 1) / len(jcts) for i in range(len(jcts))],
                label=result.policy,
                linewidth=1,
            )
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (s)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT CDF per policy")
    ax.legend()
    fig.tight_layout()
    written.append(_save(fig, out / "jct_cdf.png"))
    plt.close(fig)

    for result in results:
        edges, series = _binned_allocation(result.records, horizon, by_queue=True)
        fig, ax = plt.subplots(figsize=(10, 4))
        names = sorted(series)
        totals = [sum(series[n][b] for n in names) or 1.0 for b in range(BINS)]
        ax.stackplot(
            [e / days for e in edges],
            *[[series[n][b] / totals[b] for b in range(BINS)] for n in names],
            labels=names,
        )
        ax.set_xlabel("days since first submission")
        ax.set_ylabel("share of allocated GPUs")
        ax.set_title(f"per-queue share over time ({result.policy})")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
        fig.tight_layout()
        written.append(_save(fig, out / f"queue_share_{result.policy}.png"))
        plt.close(fig)
    return written


def _save(fig: object, path: Path) -> Path:
    fig.savefig(path, dpi=100)  # type: ignore[attr-defined]
    return path
