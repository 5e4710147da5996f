"""One screen of `corral top`: the data (also its `--json`) and how it is drawn.

Why apart from the command: a frame is a pure function of the folded log and the time, so the
same dictionary is printed as JSON, drawn once (`--once`) or redrawn live, and tested directly.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from corral.cli.output import plain_table
from corral.cli.present import SUMMARY_ABOVE, age, natural_key, node_rows, queue_rows, rack_rows
from corral.projection import ClusterView, JobState

PENDING_SHOWN = 15


def snapshot(view: ClusterView, now: datetime) -> dict[str, Any]:
    """Everything one frame shows, as plain data."""
    nodes = node_rows(view)
    jobs = list(view.jobs.values())
    pending = sorted((j for j in jobs if j.state is JobState.PENDING),
                     key=lambda j: (j.submitted_at or now, j.job_id))
    return {
        "at": now.isoformat(timespec="seconds"),
        "summary": {
            "nodes": len(nodes), "nodes_lost": sum(1 for n in nodes if n["state"] == "lost"),
            "gpus": sum(n["gpus"] for n in nodes if n["state"] != "lost"),
            "gpus_allocated": sum(n["used"] for n in nodes if n["state"] != "lost"),
            "gpus_releasing": sum(len(n["releasing"]) for n in nodes),
            "gpus_free": sum(n["free"] for n in nodes),
            "jobs": {state.value.lower(): sum(1 for j in jobs if j.state is state)
                     for state in (JobState.RUNNING, JobState.STARTING, JobState.PREEMPTING, JobState.PENDING)},
        },
        "nodes": [{k: n[k] for k in ("node", "state", "rack", "model", "gpus", "free", "map")} for n in nodes],
        # a large cluster's frame shows its racks (`SUMMARY_ABOVE`)
        "racks": rack_rows(nodes) if len(nodes) > SUMMARY_ABOVE else None,
        "queues": _queues(view),
        "pending": [{"id": j.job_id, "queue": j.queue, "user": j.user or "", "gpus": j.gpus, "prio": j.priority,
                     "waiting": age(j.submitted_at, now), "reason_code": j.reason.code if j.reason else None,
                     "reason": j.reason.message if j.reason else ""} for j in pending],
    }


def _queues(view: ClusterView) -> list[dict[str, Any]]:
    """`corral queues`' rows with each queue's fair share (`corral.summary.queue_rows`)."""
    return [{k: r[k] for k in ("queue", "guaranteed", "max", "weight", "in_use", "reserved", "pending")}
            | {"fair_share": round(r["fair_share"], 1)} for r in queue_rows(view)]


def _table(title: str, columns: list[str]) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", show_edge=False, header_style="bold",
                  box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0))
    for col in columns:
        table.add_column(col, no_wrap=col in ("NODE", "QUEUE", "ID"), overflow="fold")
    return table


def _drawn(title: str, columns: list[str], rows: list[list[str]], width: int) -> RenderableType:
    """The table as plain text when it fits `width` (`output.plain_table`: what rich draws, without
    rich's ~1 ms a row: a frame of 1,000 nodes has 63 racks), else as a rich table that wraps."""
    text = plain_table(title, columns, rows, width, title_left=True)
    if text is not None:
        return text
    table = _table(title, columns)
    for row in rows:
        table.add_row(*row)
    return table


def _bar(used: int, guaranteed: int, share: float, width: int = 20) -> Text:
    """Usage as a bar up to the larger of guarantee and fair share; `|` marks the guarantee and
    `^` the fair share."""
    scale = max(used, guaranteed, share, 1)
    cells = ["#" if i < round(used * width / scale) else "." for i in range(width)]
    g, s = min(width - 1, round(guaranteed * width / scale)), min(width - 1, round(share * width / scale))
    cells[g] = "|"
    cells[s] = "^"
    return Text("".join(cells), style="green" if used <= max(guaranteed, share) else "yellow")


def render(data: dict[str, Any], width: int = 100, *, note: str | None = None) -> RenderableType:
    """The frame of `data`, for a terminal `width` wide; `note` (a problem reading the log) in red."""
    s = data["summary"]
    jobs = s["jobs"]
    header = Text.assemble(
        ("corral top", "bold"), f"  {data['at']}   nodes {s['nodes'] - s['nodes_lost']}/{s['nodes']} up\n",
        f"GPUs {s['gpus_allocated']}/{s['gpus']} allocated, {s['gpus_releasing']} releasing, {s['gpus_free']} free   ",
        f"jobs {jobs['running']} running, {jobs['starting']} starting, {jobs['preempting']} preempting, "
        f"{jobs['pending']} pending")
    if data.get("racks"):
        nodes = _drawn(f"Racks ({s['nodes']} nodes; each node: corral nodes --rack RACK)",
                       ["RACK", "NODES", "UP", "NO NEW WORK", "FREE", "IN USE", "RELEASING"],
                       [[r["rack"], str(r["nodes"]), str(r["nodes"] - r["lost"]), str(r["draining"] + r["pressure"]),
                         f"{r['free']}/{r['gpus']}", str(r["used"]), str(r["releasing"])] for r in data["racks"]],
                       width)
    else:
        nodes = _drawn("Nodes (GPU map: job per GPU, . free, ~ releasing, | NVLink)",
                       ["NODE", "STATE", "RACK", "MODEL", "FREE", "GPU MAP"],
                       [[n["node"], n["state"], n["rack"], n["model"], f"{n['free']}/{n['gpus']}", n["map"]]
                        for n in sorted(data["nodes"], key=lambda n: natural_key(n["node"]))], width)
    queues = _table("Queues (reserved: quota held, waiting jobs' too; bar: # in use, | guarantee, ^ fair share)",
                    ["QUEUE", "IN USE", "RESERVED", "GUARANTEED", "FAIR SHARE", "MAX", "PENDING", "USE"])
    for q in data["queues"]:
        queues.add_row(q["queue"], str(q["in_use"]), str(q["reserved"]), str(q["guaranteed"]), f"{q['fair_share']:g}",
                       "-" if q["max"] is None else str(q["max"]), str(q["pending"]),
                       _bar(q["in_use"], q["guaranteed"], q["fair_share"], 16 if width < 100 else 24))
    pending = _table(f"Pending ({len(data['pending'])})", ["ID", "QUEUE", "GPUS", "WAIT", "REASON"])
    for p in data["pending"][:PENDING_SHOWN]:
        reason = f"{p['reason_code']}: {p['reason']}" if p["reason_code"] else ""
        pending.add_row(p["id"], p["queue"], str(p["gpus"]), p["waiting"], reason)
    more = len(data["pending"]) - PENDING_SHOWN
    parts: list[RenderableType] = [header, Text(""), nodes, Text(""), queues, Text(""), pending]
    if more > 0:
        parts.append(Text(f"... and {more} more pending (corral jobs --state PENDING)"))
    if note:
        parts.insert(1, Text(note, style="bold red"))
    return Group(*parts)
