"""How `corral apply` and `corral queues --history | --diff` show the queue tree's versions, a
change's what-if and the checks quota recorded (the work: `corral.cli.commands.queue_tree`).

A queue tree decides who waits and who works: every apply is a numbered version of the whole tree
in the log (who, when, why); `--what-if` prints each queue's waits, GPU-hours, fair share and
preemptions under the current and the proposed tree side by side, and each criterion's check.
"""

from __future__ import annotations

from typing import Any

from corral.cli.exit_codes import ExitCode
from corral.cli.output import console, print_table
from corral.contracts import events as ev

#: Exit code when the evidence gate refuses a change (the what-if missed a `--require`): 4, not
#: 3, which means no cluster reachable (`corral.cli.exit_codes`).
EXIT_REFUSED = ExitCode.REFUSED


def print_history(rows: list[dict[str, Any]]) -> None:
    print_table("queue tree versions", ["VERSION", "AT", "BY", "CHANGED", "ROLLBACK OF", "GATE", "MESSAGE"],
                [(r["version"], r["at"][:19], r["user"], ", ".join(r["changed"]) or "-",
                  r["rollback_of"] or "", _gate(r["evidence"]), r["message"]) for r in rows])


def print_diff(first: int, second: int, rows: list[dict[str, Any]]) -> None:
    if not rows:
        console.print(f"versions {first} and {second} are the same tree", highlight=False)
        return
    print_table(f"v{first} -> v{second}", ["QUEUE", "FIELD", f"V{first}", f"V{second}"],
                [(r["queue"], r["field"], _show(r["before"]), _show(r["after"])) for r in rows])


def print_what_if(whatif: Any, checks: list[ev.GateCheck]) -> None:
    def wait(v: float | None) -> str:
        return "-" if v is None else _duration(v)

    def pair(row: dict[str, Any], metric: str, fmt: Any) -> str:
        return f"{fmt(row[metric + '_before'])} -> {fmt(row[metric + '_after'])}"

    print_table(f"what-if: {whatif.jobs} recorded jobs replayed, current tree -> proposed tree",
                ["QUEUE", "JOBS", "AVG WAIT", "P95 WAIT", "GPU-HOURS", "FAIR SHARE", "PREEMPTIONS"],
                [(r["queue"], r["jobs"], pair(r, "avg_wait", wait), pair(r, "p95_wait", wait),
                  pair(r, "gpu_hours", lambda v: "-" if v is None else f"{v:.1f}"),
                  pair(r, "fair_share", lambda v: "-" if v is None else f"{v:.2f}"),
                  pair(r, "preemptions", lambda v: "-" if v is None else str(int(v)))) for r in whatif.rows()])
    print_checks(checks)


def print_checks(checks: list[ev.GateCheck]) -> None:
    for c in checks:
        mark = "[green]pass[/green]" if c.passed else "[red]MISS[/red]"
        console.print(f"  {mark}  {c.criterion}: measured {_measured(c)}", highlight=False)


def _measured(c: ev.GateCheck) -> str:
    def show(v: float | None) -> str:
        if v is None:
            return "-"
        return _duration(v) if c.metric.endswith("_wait") else f"{v:g}"
    return f"{show(c.before)} now -> {show(c.after)} proposed (needs {c.op} {show(c.threshold)})"


def _gate(evidence: list[dict[str, Any]]) -> str:
    return f"{sum(1 for e in evidence if e['passed'])}/{len(evidence)} passed" if evidence else ""


def _show(v: Any) -> str:
    return "-" if v is None else str(v)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"
